"""bench/router_overhead.py's router CPU targets, judged on small hand-written runs (the JSON's ``concurrency``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bench.router_overhead import router_targets


def _system(cpu: float, cpu_stream: float, p50: float = 10.0) -> dict[str, Any]:
    return {"cpu_ms_per_req": cpu, "p50_ms": p50, "stream": {"cpu_ms_per_req": cpu_stream, "p50_ms": p50}}


def _run() -> dict[str, Any]:
    """Two concurrencies; every target met: ratios at most 1.9, 0.2 ms over the floor at most, and at c=256
    polyspec's added p50 (4 ms) below vllm-router's (5 ms)."""
    return {
        "1": {"direct": _system(0.0, 0.0, 1.0), "polyspec": _system(0.5, 0.9, 1.5),
              "python_floor": _system(0.3, 0.6), "vllm_router": _system(0.3, 0.5, 1.4)},
        "256": {"direct": _system(0.0, 0.0, 100.0), "polyspec": _system(0.55, 0.95, 104.0),
                "python_floor": _system(0.4, 0.7), "vllm_router": _system(0.3, 0.5, 105.0)},
    }


def test_a_run_within_every_target_meets_them_all() -> None:
    t = router_targets(_run())
    assert t["cpu_vs_vllm_router"] == {"1": [1.67, 1.8], "256": [1.83, 1.9]}
    assert t["cpu_vs_vllm_router_max"] == 1.9 and t["cpu_within_2x_vllm_router"]
    assert t["cpu_over_floor_ms_per_req"] == {"1": [0.2, 0.3], "256": [0.15, 0.25]}
    # Streamed, polyspec is 0.3 ms over the floor: that target is judged on non-streamed cells only.
    assert t["cpu_over_floor_max_ms"] == 0.2 and t["cpu_over_floor_within_0_2ms"]
    assert t["cpu_floor_ms_per_req"] == {"1": [0.3, 0.6], "256": [0.4, 0.7]}
    assert t["c256_p50_added_ms"] == {"polyspec": 4.0, "vllm_router": 5.0}
    assert t["c256_p50_no_worse_than_vllm_router"] and t["router_cpu_targets_met"]
    assert "cpu_vs_baseline" not in t


@pytest.mark.parametrize(("cell", "stream", "cpu", "failed"), [
    ("1", True, 1.01, "cpu_within_2x_vllm_router"),  # one streamed cell over 2x (1.01 / 0.5) fails the ratio
    ("256", False, 0.61, "cpu_within_2x_vllm_router"),  # 0.61 / 0.3 > 2, and 0.21 over the floor
    ("1", False, 0.51, "cpu_over_floor_within_0_2ms"),  # 0.21 ms over the floor, not streamed
])
def test_one_cell_over_a_cpu_target_fails_it(cell: str, stream: bool, cpu: float, failed: str) -> None:
    run = _run()
    target = run[cell]["polyspec"]["stream"] if stream else run[cell]["polyspec"]
    target["cpu_ms_per_req"] = cpu
    t = router_targets(run)
    assert not t[failed] and not t["router_cpu_targets_met"]


def test_c256_latency_is_polyspec_added_p50_against_vllm_routers() -> None:
    run = _run()
    run["256"]["polyspec"]["p50_ms"] = 105.5  # 5.5 ms added against vllm-router's 5.0
    t = router_targets(run)
    assert t["c256_p50_added_ms"] == {"polyspec": 5.5, "vllm_router": 5.0}
    assert not t["c256_p50_no_worse_than_vllm_router"] and not t["router_cpu_targets_met"]
    assert t["cpu_within_2x_vllm_router"] and t["cpu_over_floor_within_0_2ms"]


def test_a_run_without_a_reference_judges_nothing_it_cannot() -> None:
    run = _run()
    for r in run.values():
        del r["vllm_router"]
    t = router_targets(run)
    assert "cpu_within_2x_vllm_router" not in t and "c256_p50_no_worse_than_vllm_router" not in t
    assert t["cpu_over_floor_within_0_2ms"] and "router_cpu_targets_met" not in t
    assert router_targets({}) == {}


def test_a_baseline_is_compared_cell_by_cell() -> None:
    run = _run()
    for r in run.values():
        r["polyspec_base"] = copy.deepcopy(r["polyspec"])
    run["1"]["polyspec_base"]["cpu_ms_per_req"] = 1.0
    assert router_targets(run)["cpu_vs_baseline"] == {"1": [0.5, 1.0], "256": [1.0, 1.0]}


def test_the_report_says_per_cell_and_per_target_what_the_run_gives() -> None:
    from bench.report import _floor_md

    run = _run()
    run["1"]["polyspec"]["stream"]["cpu_ms_per_req"] = 1.2  # 2.4x vllm-router's, streamed, at c=1
    lines = _floor_md({"concurrency": run})
    assert "| 1 | 0.50 / 1.20 | 0.30 / 0.50 | 1.67x / 2.40x | 0.30 / 0.60 | 0.20 / 0.60 |" in lines
    text = "\n".join(lines)
    assert "2x vllm-router's in every cell: **missed**; the highest ratio 2.40x (c=1, streamed)" in text
    assert "not streamed: **met**; the most 0.200 ms (c=1)" in text
    assert "**met**; polyspec +4.0 ms, vllm-router +5.0 ms" in text
    for r in run.values():
        del r["python_floor"]
    assert _floor_md({"concurrency": run}) == []  # no floor in the run: no CPU table


def test_the_ratio_is_judged_where_the_floor_leaves_room_for_polyspecs_least_own_work() -> None:
    """2x vllm-router's CPU minus the floor's is what the ratio leaves polyspec above the floor; a cell where that is
    less than polyspec's own work costs at least (``own_work_ms``) cannot meet the ratio, and the intent judges the
    ratio on the other cells only."""
    run = _run()
    run["1"]["vllm_router"]["cpu_ms_per_req"] = 0.2  # 2 x 0.2 - 0.3: 0.1 ms of room, under the 0.12 ms lower bound
    t = router_targets(run, own_work_ms=0.12)
    assert t["cpu_2x_room_ms"] == {"1": [0.1, 0.4], "256": [0.2, 0.3]}
    assert t["cpu_2x_reachable"] == {"1": [False, True], "256": [True, True]}
    assert t["cpu_vs_vllm_router"]["1"][0] == 2.5 and not t["cpu_within_2x_vllm_router"]
    assert t["cpu_within_2x_where_reachable"] and t["router_cpu_intent_met"] and not t["router_cpu_targets_met"]
    run["256"]["polyspec"]["stream"]["cpu_ms_per_req"] = 1.05  # 2.1x in a cell with room: the intent fails too
    t = router_targets(run, own_work_ms=0.12)
    assert not t["cpu_within_2x_where_reachable"] and not t["router_cpu_intent_met"]
    assert "cpu_2x_room_ms" not in router_targets(run) and "router_cpu_intent_met" not in router_targets(run)


def test_the_report_names_the_cells_the_ratio_cannot_reach() -> None:
    from bench.report import _floor_md

    run = _run()
    run["1"]["vllm_router"]["cpu_ms_per_req"] = 0.2
    text = "\n".join(_floor_md({"concurrency": run, "own_work_in_loop": {"own_work_ms": 0.12}}))
    assert "| 1 | 0.50 / 0.90 | 0.20 / 0.50 | 2.50x / 1.80x | 0.30 / 0.60 | 0.20 / 0.30 | 0.10 / 0.40 |" in text
    assert "at least 0.120 ms per request" in text and ": c=1 (0.100 ms). " in text
    assert "Within 2x in the other cells: **met**; the highest ratio there 1.90x." in text
    assert "latency target together: **met**." in text
