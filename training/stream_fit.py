"""In-memory Eagle3 training: verifier hidden states computed on the fly, several drafts in one loop.

The fit stage (training.fit) reads hidden states that the hidden-states stage wrote to disk, one file per
answer: about 4.6 KB per token for SmolLM2, so 30 GB for a few million tokens, written and read once per
epoch. On a GPU the verifier's forward pass over a packed batch costs a few milliseconds, less than
reading the same states back, so this trainer recomputes them for every batch instead and never touches
the disk. Several drafts can learn from the same batches (a vocabulary sweep): the verifier pass is shared.

Batches are what speculators trains on: each answer row becomes speculators' sample (aux states flattened,
last state PRE-norm, ``shift_batch``), and ``CollateFn`` packs the rows with their document ids. The step is
training.fit's ``train_step``. The run has a time budget rather than an epoch count: a few steps are timed,
then the number of steps is fixed and the learning-rate schedule (linear warm-up, cosine decay to
``min_lr_ratio``) is laid over it, so a shorter budget still ends with an annealed draft.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyspec.models.hidden import forward_with_hidden
from polyspec.training.config import FitConfig
from polyspec.training.errors import TrainingError
from polyspec.training.fit import train_step

CALIBRATION_STEPS = 6  # steps timed before the schedule is first set (the first one, with CUDA warm-up, excluded)
# The schedule is set again once, from the steps after calibration: on the H200 the first steps ran slower than
# the rest (allocator growth), and a 327 s budget was planned as 978 steps that took 170 s.
REPLAN_STEPS = 60


@dataclass
class Job:
    """One draft being trained on one data group."""

    name: str
    model: Any  # speculators Eagle3DraftModel, on the training device, in train mode
    group: str
    lr: float
    log_path: Path | None = None
    opt: Any = None
    sched: Any = None
    last: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Budget:
    seconds: float
    max_epochs: float = 8.0  # of the largest group: more data is better than more epochs
    max_steps: int | None = None
    warmup_fraction: float = 0.06
    min_lr_ratio: float = 0.05


def lr_factor(step: int, total: int | None, warmup_steps: int, budget: Budget) -> float:
    """Linear warm-up then cosine to ``min_lr_ratio``; while ``total`` is unknown, the warm-up alone."""
    if total is None:
        return min(1.0, (step + 1) / max(1, warmup_steps))
    warm = max(1, min(warmup_steps, int(budget.warmup_fraction * total)))
    if step < warm:
        return (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    return budget.min_lr_ratio + (1 - budget.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def pack_rows(lengths: Sequence[int], max_tokens: int, rng: random.Random, window: int = 512) -> list[list[int]]:
    """Row indices in packs of at most ``max_tokens`` tokens: shuffled, then sorted by length inside windows
    of ``window`` rows so that a pack's rows (run through the verifier as one padded batch) waste little."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    packs: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: lengths[i])
        pack: list[int] = []
        used = 0
        for i in chunk:
            n = min(lengths[i], max_tokens)
            if pack and used + n > max_tokens:
                packs.append(pack)
                pack, used = [], 0
            pack.append(i)
            used += n
        if pack:
            packs.append(pack)
    rng.shuffle(packs)
    return packs


class HiddenBatcher:
    """Answer rows -> one packed speculators batch, the verifier's aux and last states computed now."""

    def __init__(self, verifier: Any, aux_layer_ids: Sequence[int], max_tokens: int):
        self.verifier, self.aux, self.max_tokens = verifier, list(aux_layer_ids), max_tokens
        self.hidden = verifier.config.hidden_size

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import torch
        from speculators.models.eagle3.data import shift_batch
        from speculators.train.data import CollateFn

        seqs = [r["input_ids"][: self.max_tokens] for r in rows]
        masks = [r["loss_mask"][: self.max_tokens] for r in rows]
        width = max(len(s) for s in seqs)
        device = next(self.verifier.parameters()).device
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        attn = torch.zeros(len(seqs), width, dtype=torch.long)
        for row, s in enumerate(seqs):
            ids[row, : len(s)] = torch.tensor(s)
            attn[row, : len(s)] = 1
        ids, attn = ids.to(device), attn.to(device)
        with torch.no_grad():  # not inference_mode: the draft's backward saves these tensors
            _, aux, last = forward_with_hidden(self.verifier, ids, self.aux, attention_mask=attn, logits_to_keep=1)
        samples = []
        for row, s in enumerate(seqs):
            n = len(s)
            samples.append({
                "hidden_states": aux[row, :n].flatten(1),
                "input_ids": ids[row, :n],
                "verifier_last_hidden_states": last[row, :n],
                "loss_mask": torch.tensor(masks[row], dtype=torch.long, device=device),
                "lengths": torch.tensor([n], dtype=torch.long),
                "position_ids": torch.arange(n, dtype=torch.long, device=device),
            })
        collate = CollateFn(self.max_tokens, self.hidden, num_target_layers=len(self.aux), dtype=aux.dtype,
                            preprocess=shift_batch)
        batch = collate(samples)
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


class _Stream:
    """Endless packs of one group's rows, reshuffled every epoch."""

    def __init__(self, rows: list[dict[str, Any]], max_tokens: int, seed: int):
        if not rows:
            raise TrainingError("a training group has no rows")
        self.rows, self.max_tokens = rows, max_tokens
        self.rng = random.Random(seed)
        self.lengths = [len(r["input_ids"]) for r in rows]
        self.epoch, self.packs, self.pos = 0, pack_rows(self.lengths, max_tokens, self.rng), 0
        self.steps_per_epoch = len(self.packs)

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        return self

    def __next__(self) -> list[dict[str, Any]]:
        if self.pos >= len(self.packs):
            self.epoch += 1
            self.packs, self.pos = pack_rows(self.lengths, self.max_tokens, self.rng), 0
        pack = self.packs[self.pos]
        self.pos += 1
        return [self.rows[i] for i in pack]


def _optimizer(job: Job, cfg: FitConfig, factor: Callable[[int], float]) -> None:
    import torch

    params = [p for p in job.model.parameters() if p.requires_grad]
    job.opt = torch.optim.AdamW(params, lr=job.lr, weight_decay=cfg.weight_decay)
    job.sched = torch.optim.lr_scheduler.LambdaLR(job.opt, factor)


def train_jobs(verifier: Any, aux_layer_ids: Sequence[int], groups: dict[str, list[dict[str, Any]]],
               jobs: list[Job], cfg: FitConfig, budget: Budget, seed: int = 0, device: str = "cuda",
               checkpoints: Sequence[float] = (), on_checkpoint: Callable[[int, list[Job]], None] | None = None,
               ) -> dict[str, Any]:
    """Train every job for about ``budget.seconds`` of training (checkpoint callbacks not counted).

    ``checkpoints`` are fractions of the planned steps at which ``on_checkpoint(step, jobs)`` runs (a learning
    curve); 1.0 means after the last step. Returns a summary: steps, tokens per group, seconds, epochs.
    """
    from speculators.losses import resolve_loss_config

    used = {j.group for j in jobs}
    missing = used - set(groups)
    if missing:
        raise TrainingError(f"jobs name groups without data: {sorted(missing)}")
    streams = {g: _Stream(groups[g], cfg.total_seq_len, seed + n) for n, g in enumerate(sorted(used))}
    batcher = HiddenBatcher(verifier, aux_layer_ids, cfg.total_seq_len)
    plan: dict[str, Any] = {"total": budget.max_steps if budget.max_steps else None}
    marks = _marks(plan["total"], checkpoints) if plan["total"] else set()
    for job in jobs:
        _optimizer(job, cfg, lambda s: lr_factor(s, plan["total"], cfg.warmup_steps, budget))
    loss_config = resolve_loss_config(cfg.loss_fn, "eager")
    logs = {j.name: (j.log_path.open("a", encoding="utf-8") if j.log_path else None) for j in jobs}
    tokens = dict.fromkeys(streams, 0)
    step, train_seconds, t_calib = 0, 0.0, 0.0
    try:
        while plan["total"] is None or step < plan["total"]:
            t0 = time.time()
            for g, stream in streams.items():
                batch = batcher(next(stream))
                tokens[g] += int((batch["document_ids"] != -1).sum().item())
                for job in (j for j in jobs if j.group == g):
                    job.last = train_step(job.model, batch, job.opt, job.sched, cfg, loss_config, device)
                    if logs[job.name]:
                        logs[job.name].write(json.dumps({"step": step, "epoch": stream.epoch, **job.last}) + "\n")
            _sync(device)
            step += 1
            dt = time.time() - t0
            train_seconds += dt
            if step > 1:
                t_calib += dt
            if step == CALIBRATION_STEPS and plan["total"] is None:
                plan["total"] = _plan_steps(step, train_seconds, t_calib / (step - 1), budget, streams)
                plan["timed"], plan["seconds_at_calibration"] = not budget.max_steps, train_seconds
                marks = _marks(plan["total"], checkpoints)
            elif step == REPLAN_STEPS and plan.get("timed") and plan["total"] > step:
                recent = (train_seconds - plan["seconds_at_calibration"]) / (step - CALIBRATION_STEPS)
                plan["total"] = _plan_steps(step, train_seconds, recent, budget, streams)
                marks = {m for m in marks if m <= step} | {m for m in _marks(plan["total"], checkpoints) if m > step}
            if step in marks and on_checkpoint:
                on_checkpoint(step, jobs)
            if train_seconds > budget.seconds * 1.15:  # slower than timed (e.g. longer packs later): stop
                break
    finally:
        for fh in logs.values():
            if fh:
                fh.close()
    if on_checkpoint and step not in marks and checkpoints:
        on_checkpoint(step, jobs)
    return {"steps": step, "planned_steps": plan["total"], "train_seconds": round(train_seconds, 1),
            "tokens": tokens, "epochs": {g: round(tokens[g] / max(1, sum(min(n, cfg.total_seq_len) for n in s.lengths)), 2)
                                         for g, s in streams.items()},
            "steps_per_epoch": {g: s.steps_per_epoch for g, s in streams.items()},
            "last": {j.name: j.last for j in jobs}}


def _marks(total: int, fractions: Sequence[float]) -> set[int]:
    return {max(1, min(total, round(f * total))) for f in fractions}


def _plan_steps(done: int, spent: float, per_step: float, budget: Budget, streams: dict[str, _Stream]) -> int:
    by_time = done + int(max(0.0, budget.seconds - spent) / max(per_step, 1e-6))
    by_epochs = int(budget.max_epochs * max(s.steps_per_epoch for s in streams.values()))
    total = max(done, min(by_time, by_epochs))
    return min(total, budget.max_steps) if budget.max_steps else total


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
