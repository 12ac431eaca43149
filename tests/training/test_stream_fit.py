"""training.stream_fit: the in-memory trainer (hidden states on the fly, several drafts, a time budget)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from polyspec.training.config import FitConfig
from polyspec.training.errors import TrainingError
from polyspec.training.stream_fit import Budget, Job, lr_factor, pack_rows, train_jobs


def test_schedule_warms_up_then_decays_to_the_floor() -> None:
    b = Budget(seconds=1, warmup_fraction=0.1, min_lr_ratio=0.05)
    assert lr_factor(0, None, 40, b) == pytest.approx(1 / 40)  # total unknown yet: warm-up only
    ramp = [lr_factor(s, 100, 40, b) for s in range(10)]
    assert ramp == sorted(ramp) and ramp[-1] == pytest.approx(1.0)  # warm-up capped at 10 % of 100 steps
    tail = [lr_factor(s, 100, 40, b) for s in range(10, 101)]
    assert tail == sorted(tail, reverse=True) and tail[-1] == pytest.approx(0.05)


def test_packs_cover_every_row_once_within_the_budget() -> None:
    lengths = [random.Random(i).randint(5, 300) for i in range(200)]
    packs = pack_rows(lengths, 512, random.Random(0), window=64)
    assert sorted(i for p in packs for i in p) == list(range(200))
    assert all(sum(lengths[i] for i in p) <= 512 or len(p) == 1 for p in packs)
    assert pack_rows([900], 512, random.Random(0)) == [[0]]  # longer than a pack: alone (truncated later)


@pytest.fixture(scope="module")
def tiny(verifier, tmp_path_factory: pytest.TempPathFactory):
    """A random 6-layer Llama with the verifier's tokenizer, loaded, and answer-like rows for it."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-verifier")
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=49152, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (Path(verifier.path) / name).exists():
            shutil.copy(Path(verifier.path) / name, out / name)
    from polyspec.models.hidden import load_verifier_model

    model, _ = load_verifier_model(out, device="cpu")
    rng = random.Random(0)
    rows = []
    for _ in range(24):
        p, a = rng.randint(4, 12), rng.randint(8, 40)
        ids = [rng.randrange(200, 2000) for _ in range(p + a)]
        rows.append({"input_ids": ids, "loss_mask": [0] * p + [1] * a})
    return out, model, rows


def test_two_drafts_learn_from_shared_batches_and_checkpoints_fire(tiny, tmp_path: Path) -> None:
    import math

    from polyspec.models.draft_build import build_draft_model

    path, model, rows = tiny
    aux = [1, 3, 4]
    jobs = [Job(f"d{n}", build_draft_model(path, t2d_token_ids=list(range(n * 1024)), aux_layer_ids=aux).train(), "g",
                lr=1e-3, log_path=tmp_path / f"d{n}.jsonl") for n in (1, 2)]
    seen: list[tuple[int, list[str]]] = []
    summary = train_jobs(model, aux, {"g": rows}, jobs, FitConfig(total_seq_len=256, warmup_steps=2),
                         Budget(seconds=600, max_steps=4, warmup_fraction=0.5), device="cpu", checkpoints=(0.5, 1.0),
                         on_checkpoint=lambda step, js: seen.append((step, [j.name for j in js])))
    assert summary["steps"] == 4 and summary["planned_steps"] == 4
    assert [s for s, _ in seen] == [2, 4] and seen[0][1] == ["d1", "d2"]
    for job in jobs:
        lines = [json.loads(x) for x in job.log_path.read_text().splitlines()]
        assert [x["step"] for x in lines] == [0, 1, 2, 3] and all(math.isfinite(x["loss"]) for x in lines)
        assert lines[1]["lr"] > lines[0]["lr"]  # warming up
    assert summary["tokens"]["g"] > 0 and summary["epochs"]["g"] > 0


def test_a_job_without_data_is_refused(tiny) -> None:
    path, model, rows = tiny
    job = Job("x", object(), "missing", lr=1e-3)
    with pytest.raises(TrainingError, match="without data"):
        train_jobs(model, [1, 3, 4], {"g": rows}, [job], FitConfig(), Budget(seconds=1), device="cpu")
    with pytest.raises(TrainingError, match="no rows"):
        train_jobs(model, [1, 3, 4], {"g": []}, [Job("y", object(), "g", 1e-3)], FitConfig(), Budget(seconds=1),
                   device="cpu")


def test_the_schedule_is_set_again_when_steps_turn_out_faster_than_calibrated(tiny, monkeypatch) -> None:
    """On an H200, slow first steps planned a 327 s budget as 170 s of training. The second plan
    uses the steps after calibration."""
    import types

    import polyspec.training.stream_fit as sf
    from polyspec.models.draft_build import build_draft_model

    path, model, rows = tiny
    clock = {"now": 0.0, "calls": 0}

    def fake_time() -> float:  # two calls per step (start, end): 1 s per step while calibrating, then 0.1 s
        clock["calls"] += 1
        if clock["calls"] % 2 == 0:
            clock["now"] += 1.0 if clock["calls"] <= 2 * sf.CALIBRATION_STEPS else 0.1
        return clock["now"]

    monkeypatch.setattr(sf, "time", types.SimpleNamespace(time=fake_time))
    monkeypatch.setattr(sf, "REPLAN_STEPS", 10)
    job = Job("d", build_draft_model(path, t2d_token_ids=list(range(1024)), aux_layer_ids=[1, 3, 4]).train(), "g", 1e-3)
    summary = train_jobs(model, [1, 3, 4], {"g": rows}, [job], FitConfig(total_seq_len=256, warmup_steps=2),
                         Budget(seconds=14.0, max_epochs=1000), device="cpu")
    # first plan: 6 steps in 6 s, 8 s left at 1 s a step -> 14 steps; at step 10 (6.4 s spent), 0.1 s a step -> 86
    assert summary["planned_steps"] == 86 and summary["steps"] == 86
    assert 13.0 <= summary["train_seconds"] <= 14.5
