"""Triggers and the dry run: what `polyspec adapt` would do, from live stats, the plan and captured prompts."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from polyspec.adapt.triggers import assess
from polyspec.training.traffic import file_marks
from tests.adapt.conftest import capture_lines, italian, live, snapshot

EN = "en-draft@1"


def _one(assessment, language: str = "it"):
    found = [a for a in assessment.actions if a.language == language]
    assert len(found) == 1, assessment.actions
    return found[0]


def test_quiet_fleet_needs_nothing(adapt_reg, settings) -> None:
    live(adapt_reg, "en", EN, 100, mal=2.5, tokens_per_s=30)
    assert assess(adapt_reg, settings).actions == []


def test_a_language_without_draft_and_low_acceptance_is_trained(adapt_reg, settings, capture_dir) -> None:
    live(adapt_reg, "it", EN, 20, mal=1.3)
    live(adapt_reg, "en", EN, 20, mal=2.5)
    capture_lines(capture_dir, "it", italian(25))
    action = _one(assess(adapt_reg, settings))
    assert action.decision == "train" and action.chosen and action.domain == "general"
    kinds = {t.kind: t for t in action.triggers}
    assert set(kinds) == {"slow", "no-draft"}
    assert kinds["slow"].figures["basis"] == "mal" and "1.30" in kinds["slow"].why
    assert kinds["no-draft"].figures["share"] == pytest.approx(0.5)
    assert action.captured == 25 and action.new_prompts == 25


def test_speed_targets_speculation_free_and_configured(adapt_reg, settings, capture_dir, monkeypatch) -> None:
    live(adapt_reg, "it", EN, 15, tokens_per_s=11.0, mal=1.3)
    live(adapt_reg, "it", "none", 15, tokens_per_s=10.0)
    capture_lines(capture_dir, "it", italian(25))
    slow = [t for t in _one(assess(adapt_reg, settings)).triggers if t.kind == "slow"][0]
    assert slow.figures["basis"] == "speculation-free" and slow.figures["target_tokens_per_s"] == pytest.approx(13.0)
    assert "1.3 x 10.0" in slow.why
    monkeypatch.setenv("POLYSPEC_ADAPT_TARGET_TPS", json.dumps({"it": 9.5}))
    from polyspec.adapt.settings import AdaptSettings

    met = assess(adapt_reg, AdaptSettings())
    assert all(t.kind != "slow" for a in met.actions for t in a.triggers)


def test_too_few_captured_prompts_waits_and_says_how_to_fix(adapt_reg, settings, capture_dir) -> None:
    live(adapt_reg, "it", EN, 20, mal=1.3)
    capture_lines(capture_dir, "it", italian(5))
    action = _one(assess(adapt_reg, settings))
    assert action.decision == "wait" and not action.chosen
    assert "only 5 usable captured prompts" in action.why and "POLYSPEC_ROUTER_CAPTURE=1" in action.why


def test_cooldown_after_an_attempt(adapt_reg, settings, capture_dir, monkeypatch) -> None:
    live(adapt_reg, "it", EN, 20, mal=1.3)
    capture_lines(capture_dir, "it", italian(25))
    adapt_reg.record_adaptation("gate", "it", who="t", attempt="a1", status="failed")
    monkeypatch.setenv("POLYSPEC_ADAPT_COOLDOWN_S", "3600")
    from polyspec.adapt.settings import AdaptSettings

    action = _one(assess(adapt_reg, AdaptSettings()))
    assert action.decision == "wait" and action.why.startswith("cooldown: last attempt a1 (gate, failed)")


def test_an_interrupted_training_resumes_first(adapt_reg, settings, capture_dir) -> None:
    live(adapt_reg, "fr", EN, 50, mal=1.2)
    capture_lines(capture_dir, "fr", italian(25))
    adapt_reg.record_adaptation("training", "de", who="t", attempt="a-de", status="started", run_id="r1",
                                domain="general")
    adapt_reg.record_adaptation("training", "de", who="t", attempt="a-de", status="interrupted", reason="killed")
    actions = assess(adapt_reg, settings).actions
    assert [(a.language, a.decision, a.chosen) for a in actions] == [("de", "resume", True), ("fr", "train", False)]
    assert actions[0].resume["run_id"] == "r1"


def test_new_captured_prompts_since_the_last_draft(adapt_reg, settings, capture_dir, fake_draft_dir) -> None:
    rec = adapt_reg.import_draft(fake_draft_dir, verifier="smollm2-135m-instruct", name="it-draft", languages=["it"],
                                 status="active")
    adapt_reg.deploy(rec.ref, name="it-engine", url="http://127.0.0.1:8")
    capture_lines(capture_dir, "it", italian(40))
    action = _one(assess(adapt_reg, settings))
    assert [t.kind for t in action.triggers] == ["new-prompts"] and action.new_prompts == 40
    adapt_reg.record_adaptation("training", "it", who="t", attempt="a", status="done",
                                dataset={"marks": file_marks(capture_dir, "it")})
    assert assess(adapt_reg, settings).actions == []
    capture_lines(capture_dir, "it", italian(35, 100))
    assert _one(assess(adapt_reg, settings)).new_prompts == 35


def test_the_window_counts_traffic_since_the_snapshot(adapt_reg, settings, capture_dir, monkeypatch) -> None:
    from polyspec.adapt.settings import AdaptSettings
    from polyspec.adapt.triggers import counters_of

    live(adapt_reg, "it", EN, 100, mal=1.2)  # old traffic, before the window
    adapt_reg.observe_traffic(counters_of(adapt_reg.live_stats()), who="t")
    monkeypatch.setenv("POLYSPEC_ADAPT_WINDOW_S", "60")
    s = AdaptSettings()
    capture_lines(capture_dir, "it", italian(25))
    later = time.time() + 120
    live(adapt_reg, "it", EN, 4, mal=1.2)
    assessed = assess(adapt_reg, s, now=later)
    assert assessed.window_since is not None and assessed.observed["it|*"]["requests"] == 4
    assert assessed.actions == []  # 4 requests in the window: too few to judge
    live(adapt_reg, "it", EN, 30, mal=1.2)
    assert _one(assess(adapt_reg, s, now=later)).requests == 34


def test_a_slow_domain_trains_a_domain_draft(adapt_reg, settings, capture_dir) -> None:
    live(adapt_reg, "en", EN, 60, mal=2.8, domain="general")  # the language as a whole meets its target
    live(adapt_reg, "en", EN, 30, mal=1.2, domain="code")
    capture_lines(capture_dir, "en", [f"def f{i}(x): return x + {i}  # write a docstring" for i in range(25)],
                  domain="code")
    action = _one(assess(adapt_reg, settings), "en")
    assert action.domain == "code" and action.decision == "train" and action.captured == 25
    assert [t.domain for t in action.triggers] == ["code"]


def test_undetermined_and_filtered_languages_are_left_alone(adapt_reg, settings, capture_dir, monkeypatch) -> None:
    live(adapt_reg, "und", EN, 50, mal=1.0)
    live(adapt_reg, "other", EN, 50, mal=1.0)
    live(adapt_reg, "it", EN, 50, mal=1.2)
    assert [a.language for a in assess(adapt_reg, settings).actions] == ["it"]
    monkeypatch.setenv("POLYSPEC_ADAPT_LANGUAGES", '["fr"]')
    from polyspec.adapt.settings import AdaptSettings

    assert assess(adapt_reg, AdaptSettings()).actions == []


def test_dry_run_prints_and_writes_nothing(adapt_reg, settings, capture_dir, registry_url) -> None:
    from polyspec.cli import app

    live(adapt_reg, "it", EN, 20, mal=1.3)
    capture_lines(capture_dir, "it", italian(25))
    before, events = snapshot(adapt_reg), len(adapt_reg.events(1000))
    runner = CliRunner()
    table = runner.invoke(app, ["adapt", "--dry-run"], catch_exceptions=False)
    assert table.exit_code == 0 and "what it would do" in table.stdout and "train (next)" in table.stdout
    out = runner.invoke(app, ["adapt", "once", "--dry-run", "--json"], catch_exceptions=False)
    data = json.loads(out.stdout)
    assert [(a["language"], a["decision"], a["chosen"]) for a in data["actions"]] == [("it", "train", True)]
    assert data["observed"]["it|*"]["mal"] == pytest.approx(1.3, abs=0.01)
    assert snapshot(adapt_reg) == before and len(adapt_reg.events(1000)) == events
    assert adapt_reg.locks() == []


@pytest.mark.parametrize("env, value, message", [
    ("CANARY_SHARE", "2", "CANARY_SHARE"), ("MIN_REQUESTS", "0", "MIN_REQUESTS"),
    ("ROUTER_URLS", '["ftp://x"]', "ROUTER_URLS"), ("TARGET_TPS", '{"it": -1}', "TARGET_TPS"),
    ("ANSWERS", "telepathy", "ANSWERS"), ("INPLACE", "1", "INPLACE"),
])
def test_bad_settings_are_refused_with_their_name(adapt_reg, monkeypatch, env: str, value: str, message: str) -> None:
    from polyspec.cli import app

    monkeypatch.setenv(f"POLYSPEC_ADAPT_{env}", value)
    result = CliRunner().invoke(app, ["adapt", "--dry-run"])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.parametrize("every", ["5x", "", "0", "5s", "-3m", "m"])
def test_bad_every_is_refused(adapt_reg, every: str) -> None:
    from polyspec.cli import app

    result = CliRunner().invoke(app, ["adapt", "--every", every])
    assert result.exit_code == 2 and "--every" in result.output


def test_every_parses_durations() -> None:
    from polyspec.adapt.cli import parse_every

    assert [parse_every(x) for x in ("30m", "2h", "45s", "1d", "15", "1.5h")] == [1800, 7200, 45, 86400, 900, 5400]
