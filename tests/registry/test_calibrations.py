"""Engine calibrations: stored per deployment, read with the deployment by the router, validated, exported,
and kept apart from a draft the deployment no longer serves."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from polyspec.registry import NotFound, RegistryError
from tests.registry.conftest import write_at_revision

POINTS = [{"batch_size": 1, "step_s": 0.08, "tokens_per_s": 27.5, "requests": 4, "details": {"max_tokens": 64}},
          {"batch_size": 4, "step_s": 0.12, "tokens_per_s": 18.0, "requests": 8}]


@pytest.fixture()
def deployed(reg, base_draft):
    ref = f"{base_draft.name}@{base_draft.version}"
    reg.add_evaluation(ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.3, 0.1, 0.05], method="offline",
                       num_prompts=80)
    reg.add_evaluation(ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.5, 0.3, 0.2], method="offline",
                       num_prompts=40, subset="non_degenerate")
    reg.deploy(ref, name="en-engine", url="http://127.0.0.1:9", languages=["en"], default=True)
    reg.deploy(None, name="plain", url="http://127.0.0.1:10", languages=["en"])
    return ref


def test_the_newest_calibration_reaches_the_deployment_view(reg, deployed) -> None:
    assert reg.record_calibration("en-engine", POINTS) == 2
    reg.record_calibration("en-engine", [{"batch_size": 1, "step_s": 0.07, "tokens_per_s": 30.0, "requests": 4}])
    reg.record_calibration("plain", [{"batch_size": 1, "step_s": 0.05, "tokens_per_s": 20.0, "requests": 4}])
    views = {d.name: d for d in reg.active_deployments()}
    assert views["en-engine"].step_s == {1: 0.07, 4: 0.12}  # newest point per batch size
    assert views["plain"].step_s == {1: 0.05}
    # The speed model reads the non-degenerate answers' figure when there is one (served answers loop far less
    # than offline ones), even over fewer prompts.
    assert views["en-engine"].offline_acceptance == {"fr": [0.5, 0.3, 0.2]}
    assert views["en-engine"].offline_samples == {"fr": 40}
    assert views["en-engine"].k == 3
    points = reg.calibrations("en-engine")
    assert [(p.batch_size, p.step_s, p.draft_name, p.k) for p in points] == [
        (1, 0.07, deployed, 3), (4, 0.12, deployed, 3)]
    [event] = [e for e in reg.events() if e.kind == "calibrate" and e.subject == "plain"]
    assert event.details["draft"] == "none" and event.details["k"] == 0


def test_a_vllm_evaluation_at_served_length_comes_before_teacher_forced_ones(reg, deployed) -> None:
    """What a vLLM engine counted over all its answers is what the router will count: the speed model takes it
    over a teacher-forced figure, even one over more prompts, and over the engine's non-degenerate subset."""
    reg.add_evaluation(deployed, benchmark="served-24", language="fr", k=4, acceptance=[0.45, 0.25, 0.15, 0.1],
                       method="vllm", num_prompts=24)
    reg.add_evaluation(deployed, benchmark="served-24", language="fr", k=4, acceptance=[0.6, 0.4, 0.3, 0.2],
                       method="vllm", num_prompts=20, subset="non_degenerate")
    reg.add_evaluation(deployed, benchmark="mtbench", language="de", k=3, acceptance=[0.4, 0.2, 0.1],
                       method="vllm", num_prompts=10, subset="non_degenerate")
    reg.add_evaluation(deployed, benchmark="mtbench", language="de", k=3, acceptance=[0.7, 0.5, 0.3],
                       method="offline", num_prompts=80, subset="non_degenerate")
    view = next(d for d in reg.active_deployments() if d.name == "en-engine")
    assert view.offline_acceptance["fr"] == [0.45, 0.25, 0.15, 0.1]
    assert view.offline_samples["fr"] == 24
    # a vLLM figure's non-degenerate subset, when it is all there is, still comes before a teacher-forced one
    assert view.offline_acceptance["de"] == [0.4, 0.2, 0.1]


def test_a_calibration_of_another_draft_is_not_used(reg, deployed, base_draft_dir: Path) -> None:
    """A deployment re-pointed to another draft is uncalibrated until calibrated again: the old step costs
    were measured with another draft model."""
    reg.record_calibration("en-engine", POINTS)
    other = reg.import_draft(base_draft_dir, verifier=reg.verifiers()[0].name, name="en-base", languages=["en"],
                             status="active")
    reg.undeploy("en-engine")
    reg.deploy(f"{other.name}@{other.version}", name="en-engine", url="http://127.0.0.1:9", languages=["en"])
    view = next(d for d in reg.active_deployments() if d.name == "en-engine")
    assert view.step_s == {}
    assert len(reg.calibrations("en-engine")) == 2  # kept as history


@pytest.mark.parametrize("bad, message", [
    ({"batch_size": 1, "step_s": math.nan, "tokens_per_s": 1, "requests": 1}, "step_s must be a finite number"),
    ({"batch_size": 1, "step_s": -0.1, "tokens_per_s": 1, "requests": 1}, "step_s must be positive"),
    ({"batch_size": 1, "step_s": 0.1, "tokens_per_s": True, "requests": 1}, "tokens_per_s must be a finite number"),
    ({"batch_size": 10**6, "step_s": 0.1, "tokens_per_s": 1, "requests": 1}, "above 4096"),
    ({"batch_size": 1, "step_s": "fast", "tokens_per_s": 1, "requests": 1}, "step_s must be a finite number"),
    ({"step_s": 0.1, "tokens_per_s": 1, "requests": 1}, "batch_size must be a finite number"),
])
def test_bad_points_are_refused_and_nothing_is_stored(reg, deployed, bad, message) -> None:
    with pytest.raises(RegistryError, match=message):
        reg.record_calibration("en-engine", [POINTS[0], bad])
    assert reg.calibrations() == []


def test_unknown_or_stopped_deployments_and_empty_runs_are_refused(reg, deployed) -> None:
    with pytest.raises(NotFound, match="no active deployment named 'nope'"):
        reg.record_calibration("nope", POINTS)
    reg.undeploy("plain")
    with pytest.raises(NotFound):
        reg.record_calibration("plain", POINTS)
    with pytest.raises(RegistryError, match="at least one point"):
        reg.record_calibration("en-engine", [])


def test_calibrations_and_generation_time_survive_export_and_import(reg, deployed, tmp_path: Path) -> None:
    from polyspec.registry import open_registry

    reg.record_calibration("en-engine", POINTS)
    reg.record_live_stats("r1", [{"language": "fr", "domain": "general", "draft_name": deployed, "requests": 2,
                                  "completion_tokens": 100, "generation_s": 4.0}])
    export = reg.export_json()
    with open_registry(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
        added = copy.import_json(export)
        assert added["engine_calibrations"] == 2
        assert [p.step_s for p in copy.calibrations("en-engine")] == [0.08, 0.12]
        [row] = copy.live_stats()
        assert row.generation_s == 4.0 and row.counts.tokens_per_second == 25.0
        assert copy.import_json(export)["engine_calibrations"] == 0  # idempotent
    old = {**export, "live_stats": [{k: v for k, v in r.items() if k != "generation_s"} for r in export["live_stats"]]}
    old.pop("engine_calibrations")
    with open_registry(f"sqlite:///{tmp_path / 'old.db'}") as fresh:
        fresh.import_json(old)
        assert fresh.live_stats()[0].generation_s == 0.0


def test_live_generation_time_adds_up_and_bad_values_are_refused(reg, deployed) -> None:
    row = {"language": "fr", "domain": "general", "draft_name": deployed, "requests": 1, "completion_tokens": 30}
    reg.record_live_stats("r1", [{**row, "generation_s": 1.5}])
    reg.record_live_stats("r2", [{**row, "generation_s": 0.5}])
    [stat] = reg.live_stats()
    assert stat.generation_s == 2.0 and stat.counts.tokens_per_second == 30.0
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(RegistryError, match="generation_s"):
            reg.record_live_stats("r1", [{**row, "generation_s": bad}])
    assert reg.live_stats()[0].generation_s == 2.0


def test_migration_0003_keeps_live_rows_with_no_time(tmp_path: Path) -> None:
    from polyspec.registry import open_registry

    url = f"sqlite:///{tmp_path / 'old.db'}"
    open_registry(url).close()
    write_at_revision(url, "0002", (
        "INSERT INTO live_stats (router_id, language, domain, draft_name, requests, completion_tokens,"
        " num_spec_steps, num_draft_tokens, num_accepted_tokens, accepted_per_pos, updated_at)"
        " VALUES ('r', 'fr', 'general', 'none', 3, 90, 0, 0, 0, '[]', '2026-01-01 00:00:00')"))
    with open_registry(url) as reg:
        [row] = reg.live_stats()
        assert (row.requests, row.generation_s, row.counts.tokens_per_second) == (3, 0.0, None)
        assert reg.calibrations() == []


def test_calibrate_cli_refuses_bad_input_before_touching_an_engine(reg, verifier_rec, registry_url, tmp_path) -> None:
    """Bad batch lists, unknown deployments, an empty or missing registry: a clear error and exit code, no
    request sent, nothing stored."""
    from typer.testing import CliRunner

    from polyspec.cli import app

    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(app, ["engines", "calibrate", "--registry", registry_url, *args])

    for batch in ("0", "1,1", "x", "1,,300", ""):
        out = run("--batch", batch)
        assert out.exit_code == 2 and "--batch" in out.output, (batch, out.output)
    empty = run()
    assert empty.exit_code == 3 and "no active deployment to calibrate" in empty.output
    reg.deploy(None, name="plain", url="http://127.0.0.1:9", languages=["en"])
    unknown = run("-d", "nope")
    assert unknown.exit_code == 3 and "'nope'" in unknown.output and "plain" in unknown.output
    missing = runner.invoke(app, ["engines", "calibrate", "--registry", f"sqlite:///{tmp_path / 'gone.db'}"])
    assert missing.exit_code != 0 and not (tmp_path / "gone.db").exists()
    assert reg.calibrations() == []
