"""The demo: held-out split, acceptance bookkeeping, and (integration) a full run over registered drafts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from polyspec.demo import HELD_OUT, LangStats, demo_prompts, heldout_turns

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("lang", ["en", "fr"])
def test_demo_traffic_is_held_out_of_training(lang, tmp_path):
    train = [json.loads(line)["prompt"] for line in demo_prompts(lang, tmp_path, limit=1000).read_text().splitlines()]
    held = heldout_turns(lang, HELD_OUT)
    assert len(train) == 2 * (80 - HELD_OUT) and len(held) == HELD_OUT == 16
    assert not set(train) & set(held)
    # The pipeline's MT-Bench evaluation with a limit of HELD_OUT takes exactly the held-out questions.
    from polyspec.training.evaluate import load_mtbench

    assert [p.text for p in load_mtbench([lang], limit=HELD_OUT)[lang]] == held
    assert len(demo_prompts(lang, tmp_path, limit=50).read_text().splitlines()) == 50


def test_speed_table_pools_tokens_over_seconds_and_shows_a_missing_baseline_as_a_dash():
    from rich.console import Console

    from polyspec.demo import speed_table

    rows = [  # two French prompts with a baseline; Italian without one (--no-baseline, or a prompt it lacks)
        {"language": "fr", "backend": "demo-fr", "predicted_tps": 40.0, "tokens": 30, "seconds": 1.0, "plain": (20, 1.0)},
        {"language": "fr", "backend": "demo-en", "predicted_tps": 30.0, "tokens": 10, "seconds": 1.0, "plain": (10, 1.0)},
        {"language": "it", "backend": "demo-en", "predicted_tps": None, "tokens": 8, "seconds": 1.0, "plain": None},
    ]
    console = Console(width=160, record=True)
    console.print(speed_table(rows, {"fr": 24.5}))
    text = console.export_text()
    fr = next(line for line in text.splitlines() if line.startswith("│ fr"))
    # observed 40 tokens / 2 s = 20.0; no speculation 30 / 2 = 15.0 (not the mean of 20 and 10 tok/s); 1.33x
    assert [c.strip() for c in fr.split("│")[1:-1]] == ["fr", "demo-fr ×1, demo-en ×1", "24.5", "35.0", "20.0", "15.0",
                                                   "1.33×"]
    it = next(line for line in text.splitlines() if line.startswith("│ it"))
    assert [c.strip() for c in it.split("│")[1:-1]] == ["it", "demo-en ×1", "-", "-", "8.0", "-", "-"]
    assert "│ en" not in text  # no traffic, no row


def test_lang_stats_follow_vllm_definitions():
    s = LangStats()
    s.add({"acceptance_histogram": [2, 3, 3, 2]}, 40)  # 10 steps: >=1: 8, >=2: 5, >=3: 2; accepted 15
    s.add({"acceptance_histogram": [5, 3, 1, 1]}, 20)  # 10 steps: >=1: 5, >=2: 2, >=3: 1; accepted 8
    s.add(None, 7)  # a response without speculative figures still counts as a request
    assert s.drafts == {} and s.main_draft is None  # no draft header given: nothing attributed
    for draft in ("fr@1", "en@1", "fr@1"):
        s.add(None, 0, draft)
    # The acceptance table names the drafts that answered (the speed policy may send English to the French
    # draft) and takes the offline figure of the one that answered most.
    assert s.drafts == {"fr@1": 2, "en@1": 1} and s.main_draft == "fr@1"
    c = s.counts
    assert (c.requests, c.completion_tokens, c.num_spec_steps, c.num_accepted_tokens) == (6, 67, 20, 23)
    assert c.accepted_per_pos == (13, 7, 3)
    assert s.mal == pytest.approx(1 + 23 / 20)


@pytest.mark.integration
def test_a_baseline_engine_that_cannot_start_fails_the_demo_clearly(tmp_path, monkeypatch):
    """The no-speculation baseline on a verifier folder with no model in it: vLLM exits, and the demo says which
    engine failed, where its log is, and how to skip the baseline, instead of a traceback or a hang."""
    from polyspec.core.console import console
    from polyspec.core.settings import reset_settings_cache
    from polyspec.demo import DemoError, plain_baseline

    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    reset_settings_cache()  # the engine log goes under this test's home
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    try:
        with pytest.raises(DemoError) as caught:
            plain_baseline(empty, questions=1, max_tokens=8, engines=2, console=console())
    finally:
        reset_settings_cache()
    message = str(caught.value)
    assert "no-speculation engine failed" in message and "--no-baseline" in message
    assert "demo-no-speculation.log" in message


@pytest.mark.integration
def test_demo_serves_the_shipped_drafts_from_an_empty_registry(verifier, registry_url, tmp_path):
    """`make demo`'s path: an empty registry gets the shipped drafts (checksummed, gated), the fleet is planned
    for the demo's traffic on the engines memory holds, exactly that fleet is served, Japanese (no specialist)
    goes to the multilingual draft, and the speed table shows every language against no speculation."""
    from polyspec.registry import open_registry

    env = {**os.environ, "POLYSPEC_ADMIN_TOKEN": "", "CI": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "polyspec.demo", "--questions", "1", "--max-tokens", "32", "--port", "8790",
         "--base-port", "8791"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "no active" not in out  # nothing trained
    for lang in ("en", "fr", "multi"):
        assert f"shipped draft smollm2-135m-instruct-{lang}@1 imported" in out
    planned = re.search(r"Fleet for (\d+) engine slot\(s\), verifier smollm2-135m-instruct: (\d+) used", out)
    assert planned, out[-4000:]
    used = int(planned.group(2))
    assert 1 <= used <= int(planned.group(1))
    assert "Acceptance per language" in out
    assert f"calibrating {used} engine(s)" in out  # `up --calibrate`: step times before the router starts
    # The speed table: per language the engine chosen, the plan's, the router's predicted and the observed
    # tokens/s, and the speed-up over the same prompts on the verifier alone (measured before the fleet started).
    assert "no-speculation baseline: 4 prompts on the verifier alone" in out  # one per language: the phase
    # stays under 180 s with four languages
    assert "Speed per language" in out
    engines = {}
    for lang in ("en", "fr", "it", "ja"):
        row = re.search(rf"│ {lang}\s+│ (demo-[^│]+?)\s+│\s+([\d.]+) │\s+([\d.]+) │\s+([\d.]+) │\s+([\d.]+) │"
                        rf"\s+([\d.]+)× │", out)
        assert row, (lang, out[-3000:])
        engines[lang], plan, predicted, observed, plain, speedup = row.groups()
        assert float(plan) > 0 and float(predicted) > 0 and float(observed) > 0 and float(plain) > 0
        assert float(speedup) == pytest.approx(float(observed) / float(plain), abs=0.011)
    assert "demo-multi" in engines["ja"]  # no specialist: the multilingual draft serves Japanese
    assert "fleet stopped" in out
    with open_registry(registry_url) as reg:
        deps = {d.name: d for d in reg.active_deployments()}
        ja_accepted = sum(row.num_accepted_tokens for row in reg.live_stats() if row.language == "ja")
        fr_gate = [e for e in reg.events() if e.kind.startswith("promot") and "instruct-fr" in e.subject]
        reg_calibrations = reg.calibrations()
    assert len(deps) == used and all(name.startswith("demo-") for name in deps)
    assert sum(d.is_default for d in deps.values()) == 1
    assert {c.deployment for c in reg_calibrations} == set(deps)
    assert any(d.draft == "smollm2-135m-instruct-multi@1" for d in deps.values())
    assert all(d.url is None for d in deps.values())  # launched URLs removed on stop
    assert fr_gate and not any("forced" in e.kind for e in fr_gate)  # the French draft passed the gate
    assert ja_accepted > 0  # the multilingual draft accepted Japanese drafts
