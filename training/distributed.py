"""Training over several processes: ``polyspec train run --gpus N`` (or ``--launcher torchrun``).

The launcher re-runs the command under torchrun (``python -m torch.distributed.run --standalone
--nproc-per-node N``); each worker (RANK/WORLD_SIZE set by torchrun) runs the pipeline with a :class:`World`:

- answers and hidden states are sharded: rank r takes items r::N, rank 0 merges (``sharded_stage``);
- fit wraps the draft with speculators' ``apply_fully_sharded`` (FSDP2) and reads speculators' packing
  sampler with ``num_replicas=N, rank=r``, as ``speculators train`` does under torchrun;
- the other stages (prompts, vocab, evaluate, register) run on rank 0; run directories, markers, checkpoints
  and the saved draft are written by rank 0 only.

On CUDA the process group is speculators' own (``maybe_setup_distributed``: NCCL, one device per local rank).
That function asks ``torch.accelerator`` for the device and raises "No accelerator found" on a CPU-only
machine, so on CPU the group is gloo, set up here; FSDP2 runs on gloo too (torch 2.13 here), so the CPU test
exercises the same wrapping as a GPU run. Coordination (object broadcasts, barriers while rank 0 works alone)
goes through a separate gloo group with a long timeout: NCCL's default timeout (10 min) is shorter than an
answers shard or the vocabulary stage can take on a large run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyspec.core.errors import InvalidInput, PolyspecError
from polyspec.training.fit import resolve_device
from polyspec.training.runs import console, run_stage

CONTROL_TIMEOUT = dt.timedelta(hours=6)
WORKER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class WorkersFailed(PolyspecError):
    """torchrun ended with a failed (or killed) worker; the run keeps what was done and can be resumed."""

    exit_code = 1


def in_torchrun_worker() -> bool:
    """True inside a process torchrun started (it sets RANK, WORLD_SIZE and LOCAL_RANK)."""
    return all(name in os.environ for name in WORKER_ENV)


def check_nproc(nproc: int, device: str) -> None:
    """Refuse a process count this machine cannot run, before anything is created or started."""
    if nproc < 1:
        raise InvalidInput(f"--gpus must be at least 1, got {nproc}")
    if resolve_device(device) == "cuda":
        import torch

        visible = torch.cuda.device_count()
        if nproc > visible:
            raise InvalidInput(f"--gpus {nproc}: torch sees {visible} CUDA device(s) (CUDA_VISIBLE_DEVICES)")
        return
    cores = len(os.sched_getaffinity(0))
    if nproc > cores:
        raise InvalidInput(f"--gpus {nproc} without CUDA runs {nproc} gloo processes on the CPU, but this machine "
                           f"has {cores} core(s); use at most {cores} (or --device cuda on a GPU machine)")


def default_nproc(device: str) -> int:
    """``--launcher torchrun`` without ``--gpus``: every visible CUDA device, one process on CPU."""
    if resolve_device(device) == "cuda":
        import torch

        return torch.cuda.device_count()
    return 1


def torchrun_command(nproc: int, args: list[str]) -> list[str]:
    """The worker command line: this Python, torchrun's module, a standalone (single-node) rendezvous."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "polyspec.cli", *args]


def launch(nproc: int, args: list[str], run_id: str) -> None:
    """Run ``polyspec ARGS`` in ``nproc`` torchrun workers and wait; a failed worker fails the launch."""
    console.print(f"launching {nproc} worker(s) with torchrun: polyspec {' '.join(args)}")
    rc = subprocess.run(torchrun_command(nproc, args), check=False).returncode
    if rc != 0:
        raise WorkersFailed(
            f"torchrun exited with status {rc}: a worker failed or was killed (its error is above); "
            f"the other workers were stopped. Run {run_id} keeps every finished stage.",
            hint=f"polyspec train run --run-id {run_id} --resume --gpus {nproc}")


@dataclass
class World:
    """This worker's place among the torchrun workers, and the collectives the pipeline needs."""

    rank: int
    size: int
    local_rank: int
    backend: str
    control: Any  # a gloo ProcessGroup with CONTROL_TIMEOUT

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        import torch.distributed as dist

        box = [obj if self.lead else None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (also a barrier)."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.control)

    def all_reduce(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Sum scalar metric tensors over ranks in one collective (on the training group: NCCL on CUDA)."""
        import torch
        import torch.distributed as dist

        if not metrics:
            return metrics
        keys = list(metrics)
        stacked = torch.stack([metrics[k].detach().float().reshape(()) for k in keys])
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        return dict(zip(keys, stacked, strict=True))

    @staticmethod
    def digest(state: dict[str, Any]) -> str:
        """sha256 over a state dict's tensors (sorted names, float32 bytes): equal weights, equal digest."""
        digest = hashlib.sha256()
        for name in sorted(state):
            digest.update(name.encode())
            digest.update(state[name].detach().float().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    def shard_model(self, model: Any, param_dtype: Any) -> Any:
        """FSDP2 over the draft's decoder layers and the whole model, speculators' way.

        Every rank loaded the same init draft from disk, so the weights already agree; speculators broadcasts
        rank 0's state only because its fresh drafts are randomly initialised per rank.
        """
        from speculators.model import SpeculatorModel
        from speculators.train.distributed import apply_fully_sharded

        SpeculatorModel.verify_training_compatible(model)
        return apply_fully_sharded(model, param_dtype=param_dtype)


def init_world(device: str) -> World:
    """Join the process group torchrun set up the environment for (NCCL via speculators on CUDA, gloo on CPU)."""
    import torch.distributed as dist

    if device == "cuda":
        from speculators.train.distributed import maybe_setup_distributed

        maybe_setup_distributed()
    else:
        dist.init_process_group("gloo", timeout=CONTROL_TIMEOUT)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")),
                 dist.get_backend(), control)


def close_world(world: World) -> None:
    import torch.distributed as dist

    if world.backend == "nccl":
        from speculators.train.distributed import maybe_destroy_distributed

        maybe_destroy_distributed()
    elif dist.is_initialized():
        dist.destroy_process_group()


def sharded_stage(run: Any, stage: str, world: World, work: Callable[[Path], Any],
                  merge: Callable[[Path, list[Any]], dict[str, Any]], inputs: list[Path]) -> dict[str, Any]:
    """One resumable stage done by every rank: ``work(out)`` on each (its shard), then ``merge(out, results)``
    on rank 0 with every rank's result. Rank 0 owns the stage directory and its marker (``run_stage``); when
    the stage is already done, rank 0 tells the others to skip it. Every rank leaves once the marker is written,
    so the next stage finds it. Returns the summary (empty on ranks > 0)."""
    if not world.lead:
        target = world.broadcast(None)
        if target is not None:
            world.gather(work(Path(target)))
        world.barrier()
        return {}
    ran = []

    def body(out: Path) -> dict[str, Any]:
        ran.append(True)
        world.broadcast(str(out))
        return merge(out, world.gather(work(out)))

    summary = run_stage(run, stage, body, inputs, resumable=True)
    if not ran:
        world.broadcast(None)
    world.barrier()
    return summary
