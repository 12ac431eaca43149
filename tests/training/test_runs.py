"""Run directories and stage markers: skip + verify, stale inputs, corruption, missing runs, CLI errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from polyspec.training.config import RunConfig
from polyspec.training.errors import RunConfigMismatch, RunExists, RunNotFound, StageCorrupt, StageMissing
from polyspec.training.runs import MARKER, Run, run_stage
from tests.cli import polyspec


def _cfg(**kw) -> RunConfig:
    return RunConfig(run_id="r1", language="fr", parent_draft="/nowhere", **kw)


def test_stage_runs_once_then_is_verified_and_skipped(tmp_path: Path) -> None:
    run = Run.create(_cfg(), home=tmp_path)
    src = tmp_path / "input.txt"
    src.write_text("v1")
    calls = []

    def body(out: Path) -> dict:
        calls.append(out)
        (out / "result.txt").write_text(f"made from {src.read_text()}")
        return {"n": len(calls)}

    assert run_stage(run, "prompts", body, [src]) == {"n": 1}
    marker = json.loads((run.stage_dir("prompts") / MARKER).read_text())
    assert marker["outputs"]["result.txt"]["size"] == len("made from v1")
    assert marker["code_version"].startswith("0.1.0") and marker["seed"] == 0
    assert str(src.resolve()) in marker["inputs"]
    assert run_stage(run, "prompts", body, [src]) == {"n": 1} and len(calls) == 1  # skipped
    src.write_text("v2")  # an input changed: the stage is stale and runs again from scratch
    assert run_stage(run, "prompts", body, [src]) == {"n": 2}
    assert (run.stage_dir("prompts") / "result.txt").read_text() == "made from v2"


def test_corrupted_output_is_reported_not_silently_used(tmp_path: Path) -> None:
    run = Run.create(_cfg(), home=tmp_path)
    run_stage(run, "vocab", lambda out: (out / "t2d.npy").write_bytes(b"abc") and {})
    (run.stage_dir("vocab") / "t2d.npy").write_bytes(b"abd")
    with pytest.raises(StageCorrupt, match=r"t2d.npy: sha256 differs.*--redo vocab"):
        run_stage(run, "vocab", lambda out: {})
    (run.stage_dir("vocab") / "t2d.npy").unlink()
    with pytest.raises(StageCorrupt, match="t2d.npy: missing"):
        run_stage(run, "vocab", lambda out: {})


def test_interrupted_non_resumable_stage_restarts_clean(tmp_path: Path) -> None:
    run = Run.create(_cfg(), home=tmp_path)

    def crash(out: Path) -> dict:
        (out / "half.txt").write_text("partial")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run_stage(run, "prompts", crash)
    assert not run.is_done("prompts") and run.status()[0]["state"] == "partial"
    run_stage(run, "prompts", lambda out: (out / "full.txt").write_text("ok") and {})
    assert sorted(p.name for p in run.stage_dir("prompts").iterdir()) == [MARKER, "full.txt"]


def test_run_lifecycle_errors(tmp_path: Path) -> None:
    with pytest.raises(RunNotFound, match="no run 'ghost'"):
        Run.open("ghost", home=tmp_path)
    run = Run.create(_cfg(), home=tmp_path)
    with pytest.raises(RunExists, match="--resume"):
        Run.create(_cfg(), home=tmp_path)
    assert Run.create(_cfg(), home=tmp_path, exist_ok=True).root == run.root
    with pytest.raises(RunConfigMismatch, match=r"fit.epochs: 2 -> 5"):
        Run.create(_cfg(fit={"epochs": 5}), home=tmp_path, exist_ok=True)
    with pytest.raises(StageMissing, match="'answers'"):
        run.require("answers")
    with pytest.raises(RunNotFound, match="Known runs: r1"):
        Run.open("r2", home=tmp_path)


def test_config_defaults_are_the_founding_recipe() -> None:
    cfg = RunConfig(run_id="x", language="fr")
    assert (cfg.fit.epochs, cfg.fit.lr, cfg.fit.scheduler, cfg.fit.warmup_steps) == (2, 6e-5, "cosine", 120)
    assert (cfg.fit.ttt_steps, cfg.fit.ttt_step_loss_decay, cfg.fit.total_seq_len, cfg.fit.num_layers) == (3, 0.95, 8192, 1)
    assert cfg.eval.k == 3 and cfg.vocab_source == "parent"
    assert RunConfig(run_id="x", language="ru", mode="from-scratch-custom-vocab").vocab_source == "data"
    with pytest.raises(ValueError, match="ISO 639"):
        RunConfig(run_id="x", language="French")
    with pytest.raises(ValueError, match="run id"):
        RunConfig(run_id="../evil", language="fr")


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    return polyspec("train", *args, home=home)


def test_cli_errors_are_one_line(tmp_path: Path, fr_prompts: Path, verifier) -> None:
    missing = _cli("status", "ghost", home=tmp_path)
    assert missing.returncode == 2 and "no run 'ghost'" in missing.stderr and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    common = ("--verifier", str(verifier.path), "--mode", "from-scratch")
    bad = _cli("prompts", "fr", "--prompts", str(empty), "--run-id", "e1", *common, home=tmp_path)
    assert bad.returncode == 2 and "holds no prompts" in bad.stderr and "Traceback" not in bad.stderr
    no_parent = _cli("prompts", "fr", "--prompts", str(fr_prompts), "--from", "/nowhere", "--run-id", "e2",
                     "--verifier", str(verifier.path), home=tmp_path)
    assert no_parent.returncode == 2 and "parent draft '/nowhere'" in no_parent.stderr
    good = _cli("prompts", "fr", "--prompts", str(fr_prompts), "--run-id", "p1", "--json", *common, home=tmp_path)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout.strip().splitlines()[-1])["stages"]["prompts"]["train"] == 43
    status = _cli("status", "p1", "--json", home=tmp_path)
    states = {s["stage"]: s["state"] for s in json.loads(status.stdout)["stages"]}
    assert states["prompts"] == "done" and states["answers"] == "pending"
    shared = _cli("prompts", "fr", "--prompts", str(fr_prompts), "--run-id", "p2", "--verifier", str(verifier.path),
                  "--mode", "from-scratch-custom-vocab", "--reuse-from", "p1", "--json", home=tmp_path)
    assert shared.returncode == 0 and "reusing prompts of run p1" in shared.stderr, shared.stderr
    assert json.loads(shared.stdout)["stages"]["prompts"]["train"] == 43  # --json: stdout is the summaries alone
    ghost = _cli("prompts", "fr", "--prompts", str(fr_prompts), "--run-id", "p3", *common, "--reuse-from", "ghost",
                 home=tmp_path)
    assert ghost.returncode == 2 and "no run 'ghost'" in ghost.stderr and not (tmp_path / "runs" / "p3").exists()
    differ = _cli("prompts", "fr", "--prompts", str(fr_prompts), "--run-id", "p4", *common, "--max-prompts", "5",
                  "--reuse-from", "p1", home=tmp_path)
    assert differ.returncode == 2 and "prompts.max_prompts" in differ.stderr


def test_reuse_stages_shares_data_between_a_finetune_and_a_from_scratch_run(tmp_path: Path) -> None:
    from polyspec.training.runs import reuse_stages

    src = tmp_path / "prompts.jsonl"
    src.write_text('{"prompt": "Bonjour"}\n')
    prompts = {"files": [str(src)]}
    ft = Run.create(RunConfig(run_id="ft", language="fr", parent_draft="/nowhere", prompts=prompts), home=tmp_path)
    calls = []

    def body(out: Path) -> dict:
        calls.append(out)
        (out / "data.txt").write_text("answers")
        return {"rows": 1}

    for stage, inputs in (("prompts", [src]), ("answers", [ft.stage_dir("prompts") / MARKER])):
        run_stage(ft, stage, body, inputs)
    scratch = Run.create(RunConfig(run_id="scratch", language="fr", mode="from-scratch-custom-vocab", prompts=prompts,
                                   fit={"epochs": 8, "lr": 5e-4}), home=tmp_path)
    assert reuse_stages(scratch, ft, ("prompts", "answers")) == ["prompts", "answers"]
    # the copied stages are verified and skipped, not recomputed: inputs inside a run are keyed relative to it
    assert run_stage(scratch, "prompts", body, [src]) == {"rows": 1}
    assert run_stage(scratch, "answers", body, [scratch.stage_dir("prompts") / MARKER]) == {"rows": 1}
    assert len(calls) == 2
    assert (scratch.stage_dir("answers") / "data.txt").stat().st_ino == (ft.stage_dir("answers") / "data.txt").stat().st_ino

    other = Run.create(RunConfig(run_id="other", language="fr", parent_draft="/nowhere", prompts=prompts,
                                 answers={"max_new_tokens": 64}), home=tmp_path)
    with pytest.raises(RunConfigMismatch, match="answers.max_new_tokens"):
        reuse_stages(other, ft, ("prompts", "answers"))
    assert not other.is_done("answers") and other.is_done("prompts")  # the matching prefix was reused
    with pytest.raises(StageMissing):
        reuse_stages(Run.create(RunConfig(run_id="x", language="fr", parent_draft="/nowhere", prompts=prompts),
                                home=tmp_path), ft, ("prompts", "answers", "hidden-states"))
    with pytest.raises(ValueError, match="prefix"):
        reuse_stages(scratch, ft, ("answers",))
