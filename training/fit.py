"""Stage 5: train the Eagle3 draft on the stored hidden states.

The data path is read with speculators' own pieces — ``ArrowDataset`` (+ ``FileTransfer``), the
``MultipackDistributedBatchSamplerV2`` packing sampler, ``CollateFn`` and eagle3's ``shift_batch`` — so
batches are packed exactly as ``speculators train`` packs them. The step mirrors speculators' Trainer
(autocast on CUDA, AdamW, grad-norm clipping, warm-up + cosine/linear schedule); the loop is ours
because speculators' Trainer assumes an accelerator. Checkpoints are written at the end of each epoch
(atomically) and a re-run resumes from the last one.

Under torchrun (``world``, training.distributed) the draft is FSDP-sharded with speculators'
``apply_fully_sharded``, each rank reads its share of the packed batches (the sampler's ``num_replicas``/``rank``),
metrics are summed over ranks, and rank 0 alone writes metrics, checkpoints (full state dicts, gathered) and the
draft.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from polyspec.core.atomic import atomic_dir
from polyspec.models.draft_build import load_draft, save_draft
from polyspec.training.config import FitConfig
from polyspec.training.plots import plot_metrics
from polyspec.training.runs import console

CKPT_DIR = "checkpoints"
METRICS = "metrics.jsonl"


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        from polyspec.training.errors import TrainingError

        raise TrainingError("--device cuda asked for, but torch sees no CUDA device")
    return device


def make_loader(data_dir: Path, cfg: FitConfig, hidden_size: int, num_aux: int, dtype: Any, seed: int, device: str,
                rank: int = 0, replicas: int = 1):
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from torch.utils.data import DataLoader

    dataset = ArrowDataset(max_len=cfg.total_seq_len, datapath=str(data_dir), on_missing="raise", hidden_states_dtype=dtype)
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=cfg.total_seq_len, lengths=dataset.approx_lengths, num_replicas=replicas, rank=rank, seed=seed
    )
    collate = CollateFn(cfg.total_seq_len, hidden_size, num_target_layers=num_aux, dtype=dtype, preprocess=shift_batch)
    return DataLoader(dataset, batch_sampler=sampler, num_workers=0, collate_fn=collate, pin_memory=device == "cuda")


def epoch_lengths(loader: Any, epochs: int) -> list[int]:
    """Steps in each epoch: packing reshuffles every epoch, so the counts differ a little."""
    sampler = loader.batch_sampler
    counts = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        counts.append(len(sampler))
    sampler.set_epoch(0)
    return counts


def make_optimizer(model: Any, cfg: FitConfig, total: int):
    import torch
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.scheduler == "cosine":
        sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=total)
    elif cfg.scheduler == "linear":
        sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=total)
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _step: 1.0)
    return opt, sched


def _checkpoints(root: Path) -> list[tuple[int, Path]]:
    found = []
    for path in (root / CKPT_DIR).glob("epoch-*"):
        if (path / "state.pt").is_file() and path.name[6:].isdigit():
            found.append((int(path.name[6:]), path))
    return sorted(found)


def _states(model: Any, opt: Any, world: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainable weights, optimizer state): local ones, or under FSDP full ones gathered to rank 0 (a
    collective: every rank calls it; ranks > 0 get empty dicts)."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    if world is None:
        return {k: v.detach().cpu() for k, v in model.state_dict().items() if k in trainable}, opt.state_dict()
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    return {k: v for k, v in weights.items() if k in trainable}, get_optimizer_state_dict(model, opt, options=options)


def save_checkpoint(root: Path, epoch: int, global_step: int, model: Any, opt: Any, sched: Any, keep: int,
                    world: Any = None) -> None:
    """End-of-epoch state (trainable weights, optimizer, scheduler, RNG) in a temp dir renamed into place."""
    import torch

    weights, optimizer = _states(model, opt, world)
    if world is not None and not world.lead:
        return
    state = {
        "epoch": epoch,
        "global_step": global_step,
        "model": weights,
        "optimizer": optimizer,
        "scheduler": sched.state_dict(),
        "rng": torch.get_rng_state(),
        "world_size": world.size if world is not None else None,  # None: a one-process (non-FSDP) checkpoint
    }
    final = root / CKPT_DIR / f"epoch-{epoch}"
    with atomic_dir(final) as tmp:
        torch.save(state, tmp / "state.pt")
    for _, old in _checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_last_checkpoint(root: Path, model: Any, opt: Any, sched: Any, world: Any = None) -> tuple[int, int]:
    """(next epoch, global step) after restoring the last checkpoint; (0, 0) when there is none."""
    import torch

    found = _checkpoints(root)
    if not found:
        return 0, 0
    epoch, path = found[-1]
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    if (state.get("world_size") is None) != (world is None):
        from polyspec.training.errors import TrainingError

        # The optimizer state is keyed by parameter index in one format and by name in the other.
        written = "without --gpus" if state.get("world_size") is None else f"with --gpus {state['world_size']}"
        raise TrainingError(f"the checkpoint {path} was written by a fit run {written}; resume it the same way, "
                            "or start the fit again with --redo fit")
    if world is None:
        model.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["optimizer"])
    else:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)

        # Every rank read the same file, so each takes its own shards of the full state.
        set_model_state_dict(model, state["model"], options=StateDictOptions(full_state_dict=True, strict=False))
        set_optimizer_state_dict(model, opt, state["optimizer"], options=StateDictOptions(full_state_dict=True))
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    console.print(f"resuming from the checkpoint of epoch {epoch} (step {state['global_step']})")
    return epoch + 1, int(state["global_step"])


def _trim_metrics(path: Path, global_step: int) -> None:
    """Drop metric lines of steps a resumed run will redo (those after the last checkpoint)."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip() and _step_of(ln) < global_step]
    path.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (json.JSONDecodeError, KeyError, ValueError):
        return 1 << 62


def train_step(model: Any, batch: dict[str, Any], opt: Any, sched: Any, cfg: FitConfig, loss_config: Any,
               device: str, world: Any = None) -> dict[str, float]:
    import torch
    from speculators.train.utils import normalize_counted_metrics

    inputs = {k: v.to(device, non_blocking=True) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    with autocast:
        _, loss, metrics = model(**inputs, ttt_steps=cfg.ttt_steps, ttt_step_loss_decay=cfg.ttt_step_loss_decay,
                                 loss_config=loss_config)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor, already reduced over the ranks
        grad_norm = grad_norm.full_tensor()
    lr = opt.param_groups[0]["lr"]
    opt.step()
    sched.step()
    if world is not None:  # counted sums over every rank's batch, as speculators' Trainer logs them
        metrics = world.all_reduce(metrics)
    out = normalize_counted_metrics({k: float(v.item()) for k, v in metrics.items()}, world.size if world else 1)
    out.update(lr=lr, grad_norm=float(grad_norm), tokens=int((inputs["document_ids"] != -1).sum().item()))
    return out


def run_fit(out_dir: Path, data_dir: Path, init_draft: Path, verifier_path: Path, cfg: FitConfig, seed: int,
            device: str, world: Any = None) -> dict[str, Any]:
    """Train; with ``world`` (a torchrun worker) every rank calls this and only rank 0 writes files.

    Returns the summary; under torchrun every rank's summary also carries its steps, tokens and the digest of
    the full trained weights as that rank sees them (training.distributed.sharded_stage gathers them).
    """
    import torch

    device = resolve_device(device)
    torch.manual_seed(seed)
    model = load_draft(init_draft, verifier_path, attn_impl=cfg.attn_impl, device=device).train()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rank, replicas = (world.rank, world.size) if world is not None else (0, 1)
    loader = make_loader(data_dir, cfg, model.hidden_size, len(model.target_layer_ids), dtype, seed, device,
                         rank, replicas)
    per_epoch = epoch_lengths(loader, cfg.epochs)
    if world is not None:
        model = world.shard_model(model, dtype)
    opt, sched = make_optimizer(model, cfg, sum(per_epoch))
    start_epoch, step = load_last_checkpoint(out_dir, model, opt, sched, world)
    lead = world is None or world.lead
    if lead:
        _trim_metrics(out_dir / METRICS, step)
    started = time.time()
    tokens = _train_epochs(out_dir, loader, model, opt, sched, cfg, (start_epoch, step, sum(per_epoch)), device, world)
    peak = _cuda_peak_gib(device)  # GPU memory of this process' fit (reported per device)
    if world is None:
        save_draft(model.eval(), out_dir / "draft")
        mine: dict[str, Any] = {"tokens": tokens, "cuda_peak_gib": peak}
    else:
        mine = _save_sharded(model, out_dir / "draft", init_draft, verifier_path, cfg, world)
        mine.update(rank=world.rank, tokens=tokens, cuda_peak_gib=peak)
        if not world.lead:
            return mine

    plot_metrics(out_dir / METRICS, out_dir / "loss.png")
    return {**_fit_summary(out_dir / METRICS, per_epoch, start_epoch, time.time() - started, device), **mine}


def _train_epochs(out_dir: Path, loader: Any, model: Any, opt: Any, sched: Any, cfg: FitConfig,
                  position: tuple[int, int, int], device: str, world: Any) -> int:
    """The epochs left after ``position`` (start epoch, global step, planned steps); returns this rank's tokens."""
    from speculators.losses import resolve_loss_config

    start_epoch, step, planned = position
    lead = world is None or world.lead
    loss_config = resolve_loss_config(cfg.loss_fn, "eager")
    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
               TextColumn("loss {task.fields[loss]:.4f}"), TimeRemainingColumn()]
    tokens = 0
    log_file = (out_dir / METRICS).open("a", encoding="utf-8") if lead else nullcontext()
    with Progress(*columns, console=console, disable=not lead) as progress, log_file as log:
        task = progress.add_task("fit", total=planned, completed=step, loss=math.nan)
        for epoch in range(start_epoch, cfg.epochs):
            loader.batch_sampler.set_epoch(epoch)
            for batch in loader:
                metrics = train_step(model, batch, opt, sched, cfg, loss_config, device, world)
                tokens += metrics["tokens"]
                if log is not None:
                    log.write(json.dumps({"epoch": epoch, "step": step, **metrics}) + "\n")
                    log.flush()
                step += 1
                progress.update(task, advance=1, description=f"fit epoch {epoch + 1}/{cfg.epochs}", loss=metrics["loss"])
            save_checkpoint(out_dir, epoch, step, model, opt, sched, cfg.keep_checkpoints, world)
    return tokens


def _save_sharded(model: Any, out: Path, init_draft: Path, verifier_path: Path, cfg: FitConfig,
                  world: Any) -> dict[str, Any]:
    """Gather the FSDP-sharded draft on every rank (so each can report the weights it ends with), save it from
    rank 0 through a plain copy of the init draft (save_pretrained wants unsharded tensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    weights = {k: v.detach().cpu() for k, v in full.items() if k in trainable}
    if world.lead:
        plain = load_draft(init_draft, verifier_path, attn_impl=cfg.attn_impl, device="cpu")
        plain.load_state_dict(weights, strict=False)
        save_draft(plain.eval(), out)
    return {"weights_sha256": world.digest(weights)}


def _cuda_peak_gib(device: str) -> float | None:
    """Peak GPU memory allocated by torch in this process, in GiB; None off CUDA."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3)


def _fit_summary(metrics_path: Path, per_epoch: list[int], start_epoch: int, seconds: float, device: str) -> dict:
    rows = [json.loads(ln) for ln in metrics_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    last_epoch = [r for r in rows if r["epoch"] == rows[-1]["epoch"]] if rows else []
    mean = lambda key: round(sum(r.get(key, 0.0) for r in last_epoch) / max(1, len(last_epoch)), 5)  # noqa: E731
    return {
        "steps": len(rows),
        "planned_steps": sum(per_epoch),
        "resumed_from_epoch": start_epoch - 1 if start_epoch else None,
        "first_loss": round(rows[0]["loss"], 5) if rows else None,
        "last_epoch_loss": mean("loss"),
        "last_epoch_full_acc": [mean(f"full_acc_{i}") for i in range(8) if f"full_acc_{i}" in (last_epoch or [{}])[0]],
        "seconds_this_session": round(seconds, 1),
        "device": device,
    }
