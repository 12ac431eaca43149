"""The training pipeline as a Python API: prompts -> answers -> hidden states -> vocab -> fit -> evaluate -> register.

    from polyspec.training.config import RunConfig
    from polyspec.training.pipeline import start_run, run_pipeline
    run = start_run(RunConfig(run_id="fr-1", language="fr", parent_draft="/path/draft", prompts={"files": [...]}))
    summaries = run_pipeline(run)                  # every stage; done stages are verified and skipped
    run_pipeline(run, stages=["prompts"])           # one stage (earlier ones must be done)

In a torchrun worker, ``run_pipeline(run, world=World)`` shares answers, hidden states and fit among the ranks
and runs the other stages on rank 0 (training.distributed).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyspec.core.atomic import atomic_write_json
from polyspec.core.settings import get_settings
from polyspec.models.drafts import DraftInvalid, inspect_draft
from polyspec.models.verifiers import VerifierError, resolve_verifier
from polyspec.training import answer_stage
from polyspec.training import hidden_states as hs
from polyspec.training.config import STAGES, RunConfig
from polyspec.training.distributed import sharded_stage
from polyspec.training.draft_size import check_draft_size
from polyspec.training.errors import ParentDraftError, TrainingError
from polyspec.training.eval_stage import run_evaluation
from polyspec.training.fit import resolve_device, run_fit
from polyspec.training.hidden_states import default_aux_layers
from polyspec.training.multilingual import build_mix_vocab
from polyspec.training.prompts import build_prompts, read_jsonl
from polyspec.training.registration import register_candidate
from polyspec.training.runs import MARKER, Run, console, run_stage
from polyspec.training.runs import redo as redo_stage
from polyspec.training.vocab import build_vocab


@dataclass
class Context:
    run: Run
    verifier: Any  # models.verifiers.VerifierInfo
    parent: Path | None
    aux_layer_ids: list[int]
    device: str
    home: Path
    world: Any = None  # training.distributed.World in a torchrun worker


def start_run(config: RunConfig, home: Path | None = None, resume: bool = False) -> Run:
    """Create the run directory (or, with ``resume``, reopen it; its knobs must not change)."""
    return Run.create(config, home=home, exist_ok=resume)


def resolve_parent(spec: str | None, verifier: Any) -> Path | None:
    """A draft directory, or a registry reference NAME[@VERSION]; checked against the verifier."""
    if not spec:
        return None
    path = Path(spec).expanduser()
    if not path.is_dir():
        path = _parent_from_registry(spec)
    try:
        info = inspect_draft(path, verifier)
    except DraftInvalid as exc:
        raise ParentDraftError(f"parent draft {spec} cannot be used with verifier {verifier.name}: {exc}") from None
    recorded = Path(info.verifier).name if info.verifier else None
    if recorded and recorded != Path(verifier.path).name and recorded != verifier.name:
        console.print(f"[yellow]parent draft was made for {info.verifier}; its shapes fit {verifier.name}, going on")
    return path.resolve()


def _parent_from_registry(ref: str) -> Path:
    try:
        from polyspec.registry import open_registry
        from polyspec.registry.errors import RegistryError

        with open_registry() as reg:
            record = reg.get_draft(ref)
    except RegistryError as exc:
        raise ParentDraftError(f"parent draft {ref!r} is neither a directory nor a registered draft ({exc})") from None
    return Path(record.location)


def resolve_inputs(cfg: RunConfig) -> tuple[Any, Path | None]:
    """The run's verifier and parent draft, each checked, and the draft they make checked against the size limit
    (training.draft_size): from the configs alone, before a run directory or any stage."""
    try:
        verifier = resolve_verifier(cfg.verifier)
    except VerifierError as exc:
        raise TrainingError(f"verifier {cfg.verifier!r}: {exc}") from None
    if cfg.mode == "finetune" and not cfg.parent_draft:
        raise ParentDraftError("mode finetune needs a parent draft (--from DRAFT)")
    parent = resolve_parent(cfg.parent_draft, verifier)
    check_draft_size(cfg, verifier, parent)
    return verifier, parent


def make_context(run: Run, home: Path | None = None, world: Any = None) -> Context:
    cfg = run.config
    verifier, parent = resolve_inputs(cfg)
    aux = cfg.hidden.aux_layer_ids or default_aux_layers(verifier.num_layers)
    if parent is not None and cfg.mode == "finetune":
        from polyspec.models.drafts import inspect_draft

        parent_aux = inspect_draft(parent).aux_layer_ids
        if parent_aux and cfg.hidden.aux_layer_ids and list(parent_aux) != list(cfg.hidden.aux_layer_ids):
            raise ParentDraftError(f"the parent draft reads aux layers {parent_aux}; --aux-layers {aux} would not fit it")
        aux = list(parent_aux or aux)
    return Context(run, verifier, parent, list(aux), resolve_device(cfg.device), Path(home or get_settings().home), world)


def _marker(ctx: Context, stage: str) -> Path:
    return ctx.run.require(stage) / MARKER


def _prompts(ctx: Context) -> dict[str, Any]:
    cfg = ctx.run.config
    files = [*cfg.prompts.files, *(r.path for r in cfg.prompts.replay)]
    if cfg.mix is not None:
        from polyspec.training.multilingual import build_mix_prompts

        return run_stage(ctx.run, "prompts", lambda out: build_mix_prompts(out, cfg), files)
    return run_stage(ctx.run, "prompts", lambda out: build_prompts(out, cfg.language, cfg.prompts, cfg.seed), files)


def _answers(ctx: Context) -> dict[str, Any]:
    cfg, prompts, w = ctx.run.config, _marker(ctx, "prompts"), ctx.world
    if w is not None:
        work = lambda out: answer_stage.answer_shard(  # noqa: E731
            out, prompts.parent, ctx.verifier.path, cfg.answers, cfg.seed, ctx.device, w.rank, w.size)
        merge = lambda out, counts: answer_stage.merge_answer_shards(out, prompts.parent, cfg.answers, counts)  # noqa: E731
        return sharded_stage(ctx.run, "answers", w, work, merge, [prompts])
    body = lambda out: answer_stage.build_answers(out, prompts.parent, ctx.verifier.path, cfg.answers, cfg.seed, ctx.device)  # noqa: E731
    return run_stage(ctx.run, "answers", body, [prompts], resumable=True)


def _hidden(ctx: Context) -> dict[str, Any]:
    cfg, answers, w = ctx.run.config, _marker(ctx, "answers"), ctx.world
    if w is not None:
        rows = functools.cache(lambda: read_jsonl(answers.parent / "answers.jsonl"))  # read only if the stage runs
        work = lambda out: hs.write_hidden_files(  # noqa: E731
            out, rows(), range(w.rank, len(rows()), w.size), ctx.verifier.path, ctx.aux_layer_ids, cfg.hidden,
            ctx.device)
        merge = lambda out, counts: {  # noqa: E731
            **hs.finish_hidden_states(out, rows(), ctx.aux_layer_ids, cfg.hidden), "world_size": w.size,
            "samples_by_rank": counts}
        return sharded_stage(ctx.run, "hidden-states", w, work, merge, [answers])
    body = lambda out: hs.build_hidden_states(  # noqa: E731
        out, answers.parent / "answers.jsonl", ctx.verifier.path, ctx.aux_layer_ids, cfg.hidden, ctx.device)
    return run_stage(ctx.run, "hidden-states", body, [answers], resumable=True)


def _vocab(ctx: Context) -> dict[str, Any]:
    answers = _marker(ctx, "answers")
    inputs = [answers, *([ctx.parent / "model.safetensors"] if ctx.parent else [])]
    build = build_mix_vocab if ctx.run.config.mix is not None else build_vocab
    body = lambda out: build(  # noqa: E731
        out, answers.parent / "answers.jsonl", ctx.run.config, ctx.verifier, ctx.parent, ctx.aux_layer_ids)
    return run_stage(ctx.run, "vocab", body, inputs)


def _fit(ctx: Context) -> dict[str, Any]:
    cfg, hidden, vocab = ctx.run.config, _marker(ctx, "hidden-states"), _marker(ctx, "vocab")
    body = lambda out: run_fit(  # noqa: E731
        out, hidden.parent, vocab.parent / "init_draft", ctx.verifier.path, cfg.fit, cfg.seed, ctx.device, ctx.world)
    if ctx.world is not None:
        return sharded_stage(ctx.run, "fit", ctx.world, body, _merge_fit, [hidden, vocab])
    return run_stage(ctx.run, "fit", body, [hidden, vocab], resumable=True)


def _merge_fit(out: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's summary plus what each rank trained on and the weights it ended with."""
    keys = ("rank", "tokens", "weights_sha256", "cuda_peak_gib")
    return {**{k: v for k, v in results[0].items() if k not in keys}, "world_size": len(results),
            "ranks": [{k: r[k] for k in keys} for r in results]}


def _evaluate(ctx: Context) -> dict[str, Any]:
    cfg, fit, prompts = ctx.run.config, _marker(ctx, "fit"), _marker(ctx, "prompts")
    baseline = ctx.parent or (ctx.run.require("vocab") / "init_draft")
    body = lambda out: run_evaluation(  # noqa: E731
        out, cfg, ctx.verifier.path, fit.parent / "draft", baseline, prompts.parent, ctx.device)
    return run_stage(ctx.run, "evaluate", body, [fit, prompts])


def _register(ctx: Context) -> dict[str, Any]:
    evaluate = _marker(ctx, "evaluate")
    results = json.loads((evaluate.parent / "results.json").read_text(encoding="utf-8"))["results"]
    summaries = {s: ctx.run.summary(s) for s in STAGES}
    body = lambda out: _write_registration(out, register_candidate(  # noqa: E731
        ctx.run, ctx.verifier.name, ctx.run.stage_dir("fit") / "draft", results, summaries, ctx.parent, ctx.home))
    return run_stage(ctx.run, "register", body, [evaluate])


def _write_registration(out: Path, summary: dict[str, Any]) -> dict[str, Any]:
    atomic_write_json(out / "registered.json", summary)
    return summary


SHARDED = ("answers", "hidden-states", "fit")  # done by every rank under torchrun
RUNNERS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "prompts": _prompts, "answers": _answers, "hidden-states": _hidden, "vocab": _vocab,
    "fit": _fit, "evaluate": _evaluate, "register": _register,
}


def run_pipeline(run: Run, stages: Iterable[str] | None = None, redo: Iterable[str] = (),
                 home: Path | None = None, world: Any = None) -> dict[str, dict[str, Any]]:
    """Run the given stages (default: all, registration only when enabled) in order; ``world``: this torchrun
    worker's training.distributed.World (every rank calls this; only rank 0 should pass ``redo``)."""
    wanted = list(stages) if stages is not None else [
        s for s in STAGES if s != "register" or run.config.registration.enabled]
    unknown = [s for s in [*wanted, *redo] if s not in STAGES]
    if unknown:
        raise TrainingError(f"unknown stage(s) {', '.join(unknown)}; stages: {', '.join(STAGES)}")
    for stage in redo:
        redo_stage(run, stage)
    ctx = make_context(run, home, world)
    if world is not None:
        summaries = _run_distributed(ctx, [s for s in STAGES if s in wanted])
    else:
        summaries = {stage: RUNNERS[stage](ctx) for stage in STAGES if stage in wanted}
    if world is None or world.lead:
        write_run_summary(run, ctx.device, world.size if world is not None else None)
    return summaries


def write_run_summary(run: Run, device: str, world_size: int | None = None) -> dict[str, Any]:
    """runs/RUN_ID/summary.json: the languages, seconds per stage on which device, data per language,
    vocabulary coverage per language and the evaluation, from the stage markers."""
    cfg = run.config
    prompts, vocab = run.summary("prompts"), run.summary("vocab")
    out = {
        "run_id": run.run_id, "languages": cfg.languages, "mode": cfg.mode, "device": _device_name(device),
        "workers": world_size, "seconds": {s["stage"]: s["seconds"] for s in run.status() if s["seconds"] is not None},
        "data": prompts.get("languages") or {cfg.language: {k: prompts.get(k) for k in ("train", "heldout")}},
        "coverage": vocab.get("coverage"), "evaluation": run.summary("evaluate") or None,
    }
    atomic_write_json(run.root / "summary.json", out)
    return out


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return f"cuda ({torch.cuda.get_device_name(torch.cuda.current_device())}, bf16)"
    return device


def _run_distributed(ctx: Context, stages: list[str]) -> dict[str, dict[str, Any]]:
    """Every rank: the sharded stages together; the others on rank 0 while the rest wait at a barrier, which
    they leave for good after the last sharded stage (evaluation and registration need only rank 0)."""
    world, summaries = ctx.world, {}
    last = max((STAGES.index(s) for s in stages if s in SHARDED), default=-1)
    for stage in stages:
        if stage in SHARDED:
            summaries[stage] = RUNNERS[stage](ctx)
            continue
        if STAGES.index(stage) > last and not world.lead:
            break
        if world.lead:
            summaries[stage] = RUNNERS[stage](ctx)
        if STAGES.index(stage) < last:
            world.barrier()  # the next sharded stage reads what rank 0 just wrote
    return summaries
