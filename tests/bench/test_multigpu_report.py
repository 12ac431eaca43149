"""The multi-GPU report (scripts/multigpu_report.py): folding a device run, and docs/scale-out.md's generated block."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _report():
    spec = importlib.util.spec_from_file_location("multigpu_report", ROOT / "scripts" / "multigpu_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(folder: Path, name: str, seed: int, fit: dict, reused_from: str | None = None, noise: str = "") -> None:
    """A run as scripts/multigpu_device.sh brings it back: its --json output and its stage markers."""
    config = {"language": "fr", "mode": "finetune", "seed": seed,
              "prompts": {"max_prompts": 8, "replay": [{"path": "/tmp/p18/en.jsonl", "ratio": 1.0}]},
              "answers": {"max_new_tokens": 12}, "fit": {"epochs": 2, "lr": 3e-4, "warmup_steps": 1, "total_seq_len": 256},
              "eval": {"k": 3, "mtbench_max_questions": 4, "languages": ["fr", "en"], "max_new_tokens": 16}}
    (folder / name).mkdir()
    (folder / name / "run.json").write_text(json.dumps(config))
    for stage, seconds in (("answers", 10.0), ("hidden-states", 5.0), ("fit", fit["seconds_this_session"]),
                           ("evaluate", 7.0)):
        (folder / name / stage).mkdir()
        owner = reused_from if reused_from and stage in ("answers", "hidden-states") else name
        (folder / name / stage / "DONE.json").write_text(json.dumps({"run_id": owner, "seconds": seconds}))
    mal = 2.2 if "ranks" in fit else 2.18
    stages = {"fit": {"last_epoch_loss": 1.4, **fit},
              "evaluate": {"candidate": {"mtbench": {"fr": mal, "en": 2.09}, "heldout": {"fr": 2.36}},
                           "baseline": {"mtbench": {"fr": 1.85, "en": 2.13}, "heldout": {"fr": 1.98}}}}
    (folder / f"{name}.json").write_text(noise + json.dumps({"run_id": name, "stages": stages}))


def test_a_device_run_folds_into_rows_with_reuse_and_throughput(tmp_path: Path) -> None:
    report = _report()
    _run(tmp_path, "fr-g1-s0", 0, {"seconds_this_session": 40.0, "ranks": [
        {"rank": 0, "tokens": 1000, "cuda_peak_gib": 8.0}, {"rank": 1, "tokens": 1400, "cuda_peak_gib": 7.5}]})
    # an older CLI printed its "reusing" line before the JSON on stdout
    _run(tmp_path, "fr-g0-s0", 0, {"seconds_this_session": 20.0, "tokens": 2400, "cuda_peak_gib": 3.0},
         reused_from="fr-g1-s0", noise="reusing prompts, answers, hidden-states of run fr-g1-s0\n")
    data = report.fold(tmp_path, "test machine")
    rows = {r["run_id"]: r for r in data["runs"]}
    torchrun, single = rows["fr-g1-s0"], rows["fr-g0-s0"]
    assert torchrun["gpus"] == 2 and torchrun["launcher"].startswith("torchrun --gpus 2")
    assert torchrun["tokens_per_s_per_gpu"] == 30  # 2,400 tokens / 40 s / 2 GPUs
    assert torchrun["cuda_peak_gib"] == [8.0, 7.5] and torchrun["reused"] == []
    assert single["gpus"] == 1 and single["tokens_per_s_per_gpu"] == 120 and single["cuda_peak_gib"] == [3.0]
    assert single["stage_seconds"] == {"answers": None, "hidden_states": None, "fit": 20.0, "evaluate": 7.0}
    assert single["reused"] == ["answers (from fr-g1-s0)", "hidden-states (from fr-g1-s0)"]
    assert data["torchrun_minus_one_process_final_mal"] == [pytest.approx(0.02)]
    assert data["torchrun_over_one_process_fit_seconds"] == [2.0]
    assert data["seed_spread_final_mal"] is None  # one seed: no spread to state
    lines = report.block(data)
    assert lines[0] == report.MARKS[0] and lines[-1] == report.MARKS[-1]
    assert any("| fr-g0-s0 | one process (no --gpus) | 0 | reused | reused | 20 | 7 | 120 | 3.0 |" in ln for ln in lines)
    assert any("between the seeds (torchrun): n/a" in ln for ln in lines)


def test_a_run_without_its_stage_markers_is_a_clear_error(tmp_path: Path) -> None:
    report = _report()
    _run(tmp_path, "fr-g1-s0", 0, {"seconds_this_session": 40.0, "ranks": [{"rank": 0, "tokens": 10, "cuda_peak_gib": 1.0}]})
    (tmp_path / "fr-g1-s0" / "fit" / "DONE.json").unlink()
    with pytest.raises(FileNotFoundError, match="fit"):
        report.fold(tmp_path, "test machine")
