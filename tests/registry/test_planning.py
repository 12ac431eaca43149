"""`polyspec deploy plan` (registry.planning): the fastest engine per language of the traffic, the k that
maximises predicted tokens/s, and the open recommendations it stores."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from polyspec.registry import RegistryError


@pytest.fixture()
def fleet(reg, base_draft):
    ref = base_draft.ref
    reg.add_evaluation(ref, benchmark="mtbench", language="en", k=3, acceptance=[0.5, 0.3, 0.2], method="offline",
                       num_prompts=160)
    reg.add_evaluation(ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.1, 0.02, 0.0], method="offline",
                       num_prompts=160)
    reg.deploy(ref, name="en-engine", url="http://127.0.0.1:9101", languages=["en"], default=True)
    reg.deploy(None, name="plain", url="http://127.0.0.1:9102", languages=["en"])
    reg.record_calibration("en-engine", [{"batch_size": 1, "step_s": 0.080, "tokens_per_s": 25, "requests": 2}])
    reg.record_calibration("plain", [{"batch_size": 1, "step_s": 0.055, "tokens_per_s": 18, "requests": 2}])
    traffic = {"en": 60, "fr": 30, "it": 10, "und": 50}
    reg.record_live_stats("r1", [{"language": lang, "domain": "general", "draft_name": "none", "requests": n}
                                 for lang, n in traffic.items()])
    return ref


def test_each_language_gets_its_fastest_engine_and_advice(reg, fleet) -> None:
    plan = reg.plan(record=False)
    by = {lp.language: lp for lp in plan.languages}
    assert [lp.language for lp in plan.languages] == ["en", "fr", "it"]  # by traffic; und is no language
    assert by["en"].share == pytest.approx(0.6)
    assert by["en"].best.deployment == "en-engine" and by["en"].best.tps == pytest.approx(2.0 / 0.08)
    assert by["en"].speedup == pytest.approx((2.0 / 0.08) / (1 / 0.055), abs=1e-3)
    assert by["en"].advice == "serve with en-engine"
    # French through the English draft (E = 1.12) is slower than the verifier alone: no speculation, and a draft.
    assert by["fr"].best.deployment == "plain" and by["fr"].advice == "serve without speculation; train a draft for it"
    assert by["it"].best.deployment == "plain"  # no figure at all: E = 1 on the draft engine


def test_the_best_k_follows_the_linear_step_model(reg, fleet) -> None:
    """step(k) = 55 ms + 25 ms * k / 3 between the verifier alone and the calibrated k = 3; English
    acceptance 0.5, 0.3, 0.2 (then 0.133, ...): k = 2 predicts 1.8 / 71.7 ms = 25.12 tokens/s, just above
    k = 3's 25.0, too little (under 3 %) to recommend a change."""
    [kp] = reg.plan(record=False).k
    assert (kp.deployment, kp.k, kp.languages) == ("en-engine", 3, ["en"])
    assert kp.tps_by_k[1] == pytest.approx(1.5 / (0.055 + 0.025 / 3), abs=1e-3)
    assert kp.tps_by_k[2] == pytest.approx(1.8 / (0.055 + 0.05 / 3), abs=1e-3)
    assert kp.tps_by_k[3] == pytest.approx(25.0, abs=1e-3)
    assert kp.best_k == 2
    assert not [r for r in reg.plan(record=False).recommendations if r["kind"] == "change-k"]
    assert [r["subject"] for r in reg.plan(record=False, min_k_gain=1.0).recommendations
            if r["kind"] == "change-k"] == ["en-engine"]


def test_recommendations_are_stored_once_and_listed(reg, fleet) -> None:
    assert reg.plan(record=False).recommendations and reg.recommendations() == []  # a dry run writes nothing
    reg.plan()
    reg.plan()  # again: the open rows are updated, not duplicated
    recs = reg.recommendations()
    assert sorted((r["kind"], r["subject"]) for r in recs) == [
        ("no-speculation", "fr"), ("no-speculation", "it"), ("train-draft", "fr"), ("train-draft", "it")]
    assert [r["subject"] for r in reg.recommendations("train-draft")] == ["fr", "it"]
    assert len([e for e in reg.events() if e.kind == "recommend"]) == 4
    # Below min_share a language gets no draft recommendation.
    plan = reg.plan(record=False, min_share=0.2)
    assert {r["subject"] for r in plan.recommendations if r["kind"] == "train-draft"} == {"fr"}


def test_without_calibrations_the_plan_says_so(reg, base_draft) -> None:
    reg.deploy(base_draft.ref, name="en-engine", url="http://127.0.0.1:9101", languages=["en"], default=True)
    plan = reg.plan(record=False)
    [lp] = plan.languages
    assert lp.best is None and "polyspec engines calibrate" in lp.advice
    assert "calibrate" in plan.k[0].note and plan.recommendations == []


@pytest.mark.parametrize("k", [0, 17, "fast", True, 2.5])
def test_a_bad_launch_k_is_refused(reg, base_draft, k) -> None:
    with pytest.raises(RegistryError, match="launch k must be"):
        reg.deploy(base_draft.ref, name="x", launch={"k": k}, languages=["en"])


def test_k_auto_takes_the_planned_k_at_launch(reg, fleet) -> None:
    from polyspec.fleet.plan import plan_from_registry

    reg.undeploy("en-engine")
    reg.deploy(fleet, name="en-engine", launch={"k": "auto", "port": 9201}, languages=["en"], default=True)
    deps = reg.active_deployments()
    members = {m.name: m for m in plan_from_registry(deps, auto_k={"en-engine": 2})}
    assert members["en-engine"].launch["k"] == 2
    members = {m.name: m for m in plan_from_registry(deps)}
    assert members["en-engine"].launch["k"] == 3  # no plan: the draft's k


def test_deploy_plan_cli(reg, fleet, registry_url, tmp_path) -> None:
    from polyspec.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["deploy", "plan", "--registry", registry_url, "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "train a draft for it" in out.stdout and "would be recorded" in out.stdout
    assert reg.recommendations() == []
    data = json.loads(runner.invoke(app, ["deploy", "plan", "--registry", registry_url, "--json"]).stdout)
    assert data["languages"][0]["best"]["deployment"] == "en-engine"
    listed = json.loads(runner.invoke(app, ["deploy", "recommendations", "--registry", registry_url, "--json"]).stdout)
    assert len(listed) == 4
    missing = runner.invoke(app, ["deploy", "plan", "--registry", f"sqlite:///{tmp_path / 'nope.db'}"])
    assert missing.exit_code != 0 and "registry" in (missing.stderr or missing.output).lower()
    assert not (tmp_path / "nope.db").exists()  # never creates one
    bad = runner.invoke(app, ["deploy", "plan", "--registry", registry_url, "--min-share", "2"])
    assert bad.exit_code == 2
