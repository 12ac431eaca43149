"""`polyspec train run --gpus N` on CPU: the real CLI, torchrun, 2 gloo workers, a tiny run up to the fit.

The launcher creates the run and starts torchrun; rank 0 makes the prompts, both ranks answer and compute hidden
states for their half of the prompts, rank 0 builds the vocabulary, both train the FSDP-sharded draft, rank 0
saves it. A worker killed during the fit fails the launch with a clear message, and the run resumes from the
FSDP checkpoint of its first epoch. A process count the machine
cannot run must be refused before anything is created or started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from polyspec.training.prompts import read_jsonl
from tests.cli import polyspec

REPO = Path(__file__).resolve().parents[2]


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "POLYSPEC_HOME": str(home), "TOKENIZERS_PARALLELISM": "false"}


def _args(verifier, base_draft_dir: Path, fr_prompts: Path, run_id: str, *extra: str) -> list[str]:
    """`polyspec` arguments for a tiny French run up to the fit."""
    return ["train", "run", "fr", "--prompts", str(fr_prompts),
            "--from", str(base_draft_dir), "--verifier", str(verifier.path), "--run-id", run_id, "--device", "cpu",
            "--max-prompts", "8", "--max-new-tokens", "12", "--answer-batch-size", "4", "--epochs", "2",
            "--lr", "1e-3", "--warmup-steps", "1", "--total-seq-len", "256", "--ttt-steps", "1", "--until", "fit",
            *extra]


def _worker(launcher: psutil.Process, local_rank: str) -> psutil.Process | None:
    for proc in launcher.children(recursive=True):
        try:
            if proc.environ().get("LOCAL_RANK") == local_rank and "polyspec.cli" in proc.cmdline():
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def _kill_rank1_after_first_epoch(cmd: list[str], home: Path) -> tuple[subprocess.CompletedProcess, int]:
    """Start the launcher, SIGKILL the rank-1 worker once the fit's first checkpoint is on disk; (result, rank-0 pid)."""
    proc = subprocess.Popen([sys.executable, "-m", "polyspec.cli", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(home), cwd=REPO)
    checkpoint = home / "runs" / "dist" / "fit" / "checkpoints" / "epoch-0" / "state.pt"
    try:
        deadline = time.time() + 240
        while not checkpoint.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        launcher = psutil.Process(proc.pid)
        victim, survivor = _worker(launcher, "1"), _worker(launcher, "0")
        assert victim is not None and survivor is not None, "the workers were not found"
        victim.send_signal(signal.SIGKILL)
        killed_at = time.time()
        out, err = proc.communicate(timeout=120)
        print(f"launcher exited {time.time() - killed_at:.1f} s after the kill")
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), survivor.pid


def test_two_gloo_workers_shard_the_data_and_train_one_draft(verifier, base_draft_dir: Path, fr_prompts: Path,
                                                             tmp_path: Path) -> None:
    started = time.time()
    killed, rank0 = _kill_rank1_after_first_epoch(_args(verifier, base_draft_dir, fr_prompts, "dist", "--gpus", "2"),
                                                  tmp_path)
    assert killed.returncode == 1, killed.stderr[-3000:]
    assert "a worker failed or was killed" in killed.stderr
    assert "hint: polyspec train run --run-id dist --resume --gpus 2" in killed.stderr
    assert not psutil.pid_exists(rank0) or psutil.Process(rank0).status() == psutil.STATUS_ZOMBIE  # torchrun stopped it
    run = tmp_path / "runs" / "dist"
    print(f"killed at {time.time() - started:.1f} s")
    assert not (run / "fit" / "DONE.json").exists() and (run / "hidden-states" / "DONE.json").exists()

    resumed = subprocess.run([sys.executable, "-m", "polyspec.cli", "train", "run", "--run-id", "dist", "--resume",
                              "--until", "fit", "--gpus", "2", "--json"],
                             capture_output=True, text=True, env=_env(tmp_path), cwd=REPO, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    print(f"2-worker tiny run, killed and resumed: {time.time() - started:.1f} s")
    stages = json.loads(resumed.stdout.strip().splitlines()[-1])["stages"]
    _check_data_stages(run, stages)
    _check_fit(run, stages["fit"], verifier, base_draft_dir)


def _check_data_stages(run: Path, stages: dict) -> None:
    train_ids = [r["id"] for r in read_jsonl(run / "prompts" / "train.jsonl")]
    answers = stages["answers"]
    assert answers["world_size"] == 2 and all(n > 0 for n in answers["answers_by_rank"])  # both ranks answered
    assert sum(answers["answers_by_rank"]) == answers["answers"] == len(train_ids) == 8
    assert [r["id"] for r in read_jsonl(run / "answers" / "answers.jsonl")] == train_ids  # each prompt once, in order
    assert not (run / "answers" / "shards").exists()
    hidden = stages["hidden-states"]
    assert hidden["samples_by_rank"] == [4, 4] and hidden["samples"] == 8
    assert len(list((run / "hidden-states" / "hidden_states").glob("hs_*.safetensors"))) == 8


def _check_fit(run: Path, fit: dict, verifier, base_draft_dir: Path) -> None:
    import torch

    from polyspec.models.draft_build import load_draft

    assert fit["world_size"] == 2 and [r["rank"] for r in fit["ranks"]] == [0, 1]
    assert fit["resumed_from_epoch"] == 0  # from the FSDP checkpoint written before the kill
    assert all(r["tokens"] > 0 for r in fit["ranks"])  # both ranks trained on their own batches
    assert all(r["cuda_peak_gib"] is None for r in fit["ranks"])  # on CPU no GPU memory is reported
    assert fit["ranks"][0]["weights_sha256"] == fit["ranks"][1]["weights_sha256"]
    steps = [json.loads(line)["step"] for line in (run / "fit" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(fit["steps"])) and fit["steps"] == fit["planned_steps"] > 0  # written once, by rank 0
    assert fit["last_epoch_loss"] < fit["first_loss"]
    assert sorted(p.name for p in (run / "fit").iterdir() if "draft" in p.name) == ["draft"]  # saved once

    draft, start = load_draft(run / "fit" / "draft", verifier.path), load_draft(base_draft_dir, verifier.path)
    last = torch.load(sorted((run / "fit" / "checkpoints").glob("epoch-*"))[-1] / "state.pt", weights_only=False)
    assert last["world_size"] == 2 and last["epoch"] == 1 and last["model"]
    saved, initial = draft.state_dict(), start.state_dict()
    for name, trained in last["model"].items():  # the saved draft is the trained one (bf16 on disk)
        assert torch.allclose(saved[name].float(), trained.float(), atol=2e-2, rtol=2e-2), name
    assert any(not torch.equal(saved[n], initial[n]) for n in last["model"])


@pytest.mark.parametrize("gpus", ["0", "-1", "cores+1"])
def test_impossible_process_counts_start_nothing(gpus: str, verifier, base_draft_dir: Path, fr_prompts: Path,
                                                 tmp_path: Path) -> None:
    n = str(len(os.sched_getaffinity(0)) + 1) if gpus == "cores+1" else gpus
    out = polyspec(*_args(verifier, base_draft_dir, fr_prompts, "bad", f"--gpus={n}"), home=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "--gpus" in out.stderr and "Traceback" not in out.stderr and "launching" not in out.stderr
    assert not (tmp_path / "runs").exists()


def test_unknown_launcher_is_refused(verifier, base_draft_dir: Path, fr_prompts: Path, tmp_path: Path) -> None:
    out = polyspec(*_args(verifier, base_draft_dir, fr_prompts, "bad", "--launcher", "mpirun"), home=tmp_path)
    assert out.returncode == 2 and "--launcher must be torchrun" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_merging_answer_shards_keeps_each_prompt_once(tmp_path: Path) -> None:
    from polyspec.training.answer_stage import SHARDS, merge_answer_shards
    from polyspec.training.answers import ANSWERS, make_row
    from polyspec.training.config import AnswersConfig
    from polyspec.training.errors import TrainingError

    prompts, out = tmp_path / "prompts", tmp_path / "answers"
    (prompts).mkdir()
    (out / SHARDS).mkdir(parents=True)
    (prompts / "train.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in "abc"))

    def rows(*ids: str) -> str:
        return "".join(json.dumps(make_row({"id": i}, [1, 2], [3], True, "x")) + "\n" for i in ids)

    (out / ANSWERS).write_text(rows("a"))  # an earlier one-process attempt
    (out / SHARDS / "rank0.jsonl").write_text(rows("c", "a") + '{"id": "b", "inp')  # a torn last line
    (out / SHARDS / "rank1.jsonl").write_text(rows("b"))
    summary = merge_answer_shards(out, prompts, AnswersConfig(), [2, 1])
    assert [r["id"] for r in read_jsonl(out / ANSWERS)] == ["a", "b", "c"] and not (out / SHARDS).exists()
    assert summary["answers"] == 3 and summary["answers_by_rank"] == [2, 1] and summary["world_size"] == 2

    (out / SHARDS).mkdir()
    (out / SHARDS / "rank0.jsonl").write_text(rows("z"))
    with pytest.raises(TrainingError, match="'z', which prompts/train.jsonl does not hold"):
        merge_answer_shards(out, prompts, AnswersConfig(), [1])
    assert [r["id"] for r in read_jsonl(out / ANSWERS)] == ["a", "b", "c"]  # left as it was


@pytest.mark.parametrize(("written", "resumed_with", "says"), [(None, "gpus", "without --gpus"),
                                                                (2, None, "with --gpus 2")])
def test_a_fit_checkpoint_resumes_only_under_the_launch_that_wrote_it(tmp_path: Path, written, resumed_with,
                                                                      says: str) -> None:
    import torch

    from polyspec.training.errors import TrainingError
    from polyspec.training.fit import CKPT_DIR, load_last_checkpoint

    (tmp_path / CKPT_DIR / "epoch-0").mkdir(parents=True)
    torch.save({"epoch": 0, "global_step": 3, "model": {}, "optimizer": {}, "world_size": written},
               tmp_path / CKPT_DIR / "epoch-0" / "state.pt")
    world = object() if resumed_with else None  # refused before the world is used
    with pytest.raises(TrainingError, match=f"written by a fit run {says}.*--redo fit"):
        load_last_checkpoint(tmp_path, torch.nn.Linear(1, 1), None, None, world)
