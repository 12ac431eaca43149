"""bench/fleet_figures.py on made-up rows: per-language figures, the weighted row, the targets and the table."""

from __future__ import annotations

from typing import Any

import pytest

from bench.fleet_figures import (
    ORDERS, SYSTEMS, fleet_plan_md, fleet_plan_summary, language_figures, plot, predicted_tps, rotation, targets,
    weighted_figures, weighted_ratio,
)

# tokens/s of each system per language; every request answers 60 tokens
SPEED = {"fr": {"no_spec": 10.0, "specialist_fleet": 12.0, "planned_fleet": 16.0},
         "ja": {"no_spec": 10.0, "specialist_fleet": 9.0, "planned_fleet": 13.0}}
SIGN = {"no_spec": -1, "specialist_fleet": 0, "planned_fleet": 1}


def rows(prompts: int = 6, noise: float = 0.0) -> list[dict[str, Any]]:
    out = []
    for lang, speeds in SPEED.items():
        for n in range(prompts):
            for slot, system in enumerate(rotation(n)):
                # per-prompt noise in opposite directions that cancels over each three prompts: the cells'
                # tokens/s stay exactly SPEED's while the per-prompt ratios spread
                seconds = 60 / speeds[system] * (1 + noise * ((n % 3) - 1) * SIGN[system])
                out.append({"language": lang, "prompt_id": f"{lang}-{n}", "system": system, "ok": True,
                            "tokens": 60, "seconds": seconds, "backend": f"{system}-engine", "slot": slot,
                            "histogram": [], "spec_steps": 0, "misrouted": False,
                            "predicted_seconds": seconds / 1.05})
    return out


def test_orders_balance_slots_and_successors() -> None:
    slots = {(s, i): 0 for s in SYSTEMS for i in range(3)}
    after = {(a, b): 0 for a in SYSTEMS for b in SYSTEMS if a != b}
    for n in range(len(ORDERS)):
        order = rotation(n)
        assert sorted(order) == sorted(SYSTEMS)
        for i, s in enumerate(order):
            slots[(s, i)] += 1
        for a, b in zip(order, order[1:], strict=False):
            after[(a, b)] += 1
    assert set(slots.values()) == {2} and set(after.values()) == {2}


def test_language_figures_ratio_interval_and_prediction() -> None:
    r = language_figures(rows(noise=0.1), "fr", k=3)
    assert r["n"] == 6 and r["no_spec_tps"] < r["specialist_fleet_tps"] < r["planned_fleet_tps"]
    assert r["planned_over_no_spec"]["ratio"] == pytest.approx(1.6, abs=0.01)
    low, high = r["ci95"]
    assert low < r["planned_over_no_spec"]["ratio"] < high and r["ci95"] == r["planned_over_no_spec"]["ci95"]
    assert r["predicted_over_observed"]["planned_fleet"] == pytest.approx(1.05, abs=1e-3)
    assert r["engines"]["planned_fleet"] == {"planned_fleet-engine": 6}


def test_predicted_tps_ignores_failed_and_unpredicted_rows() -> None:
    ok = {"ok": True, "tokens": 50, "predicted_seconds": 5.0}
    assert predicted_tps([ok, {**ok, "ok": False}, {**ok, "predicted_seconds": None}]) == 10.0
    assert predicted_tps([{**ok, "predicted_seconds": None}]) is None


def test_weighted_ratio_is_the_share_weighted_mean_with_an_interval() -> None:
    data = rows(noise=0.1)
    shares = {"fr": 0.5, "ja": 0.5}
    w = weighted_ratio(data, shares, "planned_fleet", "no_spec")
    assert w["ratio"] == pytest.approx((0.5 * 16 + 0.5 * 13) / 10.0, abs=0.01)
    assert w["ci95"][0] < w["ratio"] < w["ci95"][1]
    tilted = weighted_ratio(data, {"fr": 0.9, "ja": 0.1}, "planned_fleet", "no_spec")
    assert tilted["ratio"] > w["ratio"]  # French gains more
    assert weighted_ratio(data, {"fr": 0.5, "pt": 0.5}, "planned_fleet", "no_spec")["missing"] == ["pt"]
    few = weighted_ratio(rows(prompts=2), shares, "planned_fleet", "no_spec")
    assert few["ci95"] is None and few["ratio"] is not None  # two prompts: no interval of zero width


def test_targets_judge_each_bar() -> None:
    data = rows(noise=0.05)
    langs = {lang: language_figures(data, lang, k=3) for lang in SPEED}
    shares = {"fr": 0.5, "ja": 0.5}
    w = weighted_figures(langs, data, shares, {"no_spec": 1, "specialist_fleet": 5, "planned_fleet": 2})
    assert w["planned_fleet_tps"] > w["specialist_fleet_tps"] and w["engines"]["planned_fleet"] == 2
    t = targets(langs, w)
    assert t["fr"]["met"] and t["ja"]["ratio"] == pytest.approx(1.3, abs=0.01) and not t["ja"]["met"]
    assert t["every_language"]["met"] and t["weighted"]["met"] and t["predictions"]["met"]
    more_engines = targets(langs, {**w, "engines": {"no_spec": 1, "specialist_fleet": 1, "planned_fleet": 2}})
    assert not more_engines["weighted"]["met"]
    langs["fr"]["predicted_over_observed"]["planned_fleet"] = 1.2
    assert targets(langs, w)["predictions"]["outside"] == {"fr": 1.2}


def test_a_miss_beyond_the_prompts_own_spread_is_named_apart() -> None:
    """The observed tokens/s of a cell has an interval over its prompts; a prediction outside it is a miss the
    prompts' spread does not explain, one inside it is not shown wrong by this run."""
    data = rows(noise=0.2)
    langs = {lang: language_figures(data, lang, k=3) for lang in SPEED}
    low, high = langs["fr"]["observed_tps_ci95"]["planned_fleet"]
    assert low < langs["fr"]["planned_fleet_tps"] < high
    w = weighted_figures(langs, data, {"fr": 0.5, "ja": 0.5}, {"no_spec": 1, "specialist_fleet": 5, "planned_fleet": 2})
    assert targets(langs, w)["predictions"]["outside_observed_interval"] == {}
    langs["fr"]["predicted_tps"]["planned_fleet"] = high * 1.01
    assert targets(langs, w)["predictions"]["outside_observed_interval"] == {"fr": high * 1.01}
    assert f"({low:.1f}–{high:.1f})" in fleet_plan_md({**run(), "languages": langs})
    summary = fleet_plan_summary({**run(), "languages": langs})
    assert "Predicted / observed tokens/s of the planned fleet: fr 1.05, ja 1.05 (mean error 5.0%)" in summary
    assert "outside the observed 95 % interval over prompts: fr." in summary


def run() -> dict[str, Any]:
    data = rows(noise=0.05)
    langs = {lang: language_figures(data, lang, k=3) for lang in SPEED}
    counts = {"no_spec": 1, "specialist_fleet": 5, "planned_fleet": 2}
    w = weighted_figures(langs, data, {"fr": 0.5, "ja": 0.5}, counts)
    equal = weighted_figures(langs, data, {"fr": 0.5, "ja": 0.5}, counts)
    return {"commit": "abc1234", "machine": {"cpus": 2}, "requests": len(data), "languages": langs, "weighted": w,
            "weighted_equal": equal, "targets": targets(langs, w, equal),
            "fleets": {"specialist_fleet": ["en-k3", "fr-k3"]},
            "plan": {"entries": [{"name": "multi-k3", "k": 3, "replicas": 1}]},
            "planner_plan": {"entries": [{"name": "multi-k5", "k": 5, "replicas": 1}]},
            "settings": {"k": 3, "max_tokens": 96, "orders": "rounds", "traffic_label": "the demo's traffic"}}


def test_markdown_shows_every_language_the_weighted_rows_and_the_verdicts() -> None:
    md = fleet_plan_md(run())
    assert "| fr | 6 |" in md and "| ja | 6 |" in md
    assert "**weighted** (the demo's traffic)" in md and "**weighted** (equal over the 2 languages)" in md
    assert "- fr: met" in md and "- ja: NOT met" in md and "multi-k3 (k 3, 1 engine)" in md
    summary = fleet_plan_summary(run())
    assert "fr 1.60x" in summary and "not met: ja" in summary and "multi-k5" in summary
    assert "k = 3;" in summary and "multi-k3 (k 3, 1 engine)" in md


def test_a_run_of_the_planner_s_own_plan_says_so() -> None:
    """With --planned-k 0 the planned fleet is what `polyspec deploy plan` chooses: the text names the command
    and says which fleets ran at which k."""
    d = run()
    d["plan"] = d["planner_plan"]
    d["settings"].update(planned_k="planner", plan_engines=2)
    md, summary = fleet_plan_md(d), fleet_plan_summary(d)
    assert "specialists at k = 3, the planned fleet at the planner's k" in md and "multi-k5 (k 5, 1 engine)" in md
    assert "what `polyspec deploy plan --engines 2` chooses" in summary and "planner's own k gives" not in summary


def test_plot_is_drawn(tmp_path) -> None:
    plot(run(), tmp_path / "fleet.png")
    assert (tmp_path / "fleet.png").stat().st_size > 10_000


def test_docs_blocks_are_replaced_in_place(tmp_path) -> None:
    from bench.fleet_figures import DOCS, write_docs

    for name, (begin, end) in DOCS.items():
        (tmp_path / name).write_text(f"before\n{begin}\nold figures\n{end}\nafter\n", encoding="utf-8")
    write_docs(run(), tmp_path)
    write_docs(run(), tmp_path)  # twice: the same page
    page = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    assert page.startswith("before\n") and page.endswith("after\n") and "old figures" not in page
    assert fleet_plan_md(run()) in page and page.count("| fr | 6 |") == 1
    assert fleet_plan_summary(run()) in (tmp_path / "speed.md").read_text(encoding="utf-8")
    (tmp_path / "speed.md").write_text("no markers", encoding="utf-8")
    with pytest.raises(SystemExit, match="lacks the markers"):
        write_docs(run(), tmp_path)
