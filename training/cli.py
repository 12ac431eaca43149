"""`polyspec train ...`: the training pipeline from the command line.

    polyspec train run fr --prompts fr.jsonl --from DRAFT            # every stage, a new run
    polyspec train run --run-id fr-finetune-... --resume            # continue (done stages are verified, skipped)
    polyspec train run fr --prompts fr.jsonl --from DRAFT --gpus 8  # torchrun, 8 workers (docs/distributed-training.md)
    polyspec train prompts fr --prompts fr.jsonl --run-id fr-1      # only stage 1 (creates the run)
    polyspec train answers fr-1 / hidden-states / vocab / fit / evaluate / register   # one stage of a run
    polyspec train --plan fr                                        # the registry's add-language plan for fr
    polyspec train status fr-1 ; polyspec train list
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from polyspec.core.cli import PolyspecTyper
from polyspec.training import distributed
from polyspec.training.cli_options import knob_signature_source, knobs_to_config
from polyspec.training.config import STAGES
from polyspec.training.fit import resolve_device
from polyspec.training.pipeline import resolve_inputs, run_pipeline, start_run
from polyspec.training.plan import config_from_plan
from polyspec.training.run_guard import discard_on_input_error, note_input_error
from polyspec.training.runs import Run, reuse_stages, runs_root
from polyspec.training.runs import redo as redo_stage

app = PolyspecTyper(help="Train per-language Eagle3 drafts: prompts -> answers -> hidden states -> vocab -> fit -> "
                       "evaluate -> register.", no_args_is_help=False, invoke_without_command=True)


def _print_result(summaries: dict[str, Any], run: Any, as_json: bool) -> None:
    if as_json:
        summary = run.root / "summary.json"
        typer.echo(json.dumps({"run_id": run.run_id, "dir": str(run.root), "stages": summaries,
                               "summary": json.loads(summary.read_text()) if summary.is_file() else None}, default=str))
        return
    typer.echo(f"run {run.run_id}: {run.root}")


def _stages_for(until: str | None) -> list[str] | None:
    if until is None:
        return None
    if until not in STAGES:
        raise ValueError(f"--until must be one of {', '.join(STAGES)}")
    return list(STAGES[: STAGES.index(until) + 1])


def _open_or_create(check: Any = None, **knobs: Any) -> Any:
    """Create (or with --resume reopen) the run the knobs describe; ``check(config)`` runs before anything is
    created."""
    resume, reuse_from = knobs.pop("resume"), knobs.pop("reuse_from", None)
    if resume and not knobs.get("run_id"):
        raise typer.BadParameter("--resume needs --run-id")
    saved = Run.open(knobs["run_id"]).config if resume else None
    config = knobs_to_config(knobs, saved)
    if check is not None:
        check(config)
    resolve_inputs(config)  # a bad verifier or parent, or a draft over the size limit, fails before the run exists
    source = Run.open(reuse_from) if reuse_from else None  # before creating: a bad name leaves nothing behind
    run = start_run(config, resume=resume)
    if source is not None:
        shared: list[str] = []
        for stage in ("prompts", "answers", "hidden-states"):  # the done prefix of the data stages
            if not source.is_done(stage):
                break
            shared.append(stage)
        # stderr: with --json, stdout holds the summaries alone
        typer.echo(f"reusing {', '.join(reuse_stages(run, source, shared)) or 'nothing'} of run {source.run_id}", err=True)
    return run


def _run_command(*, until: Optional[str] = None, redo: Optional[list[str]] = None, json_out: bool = False,
                 gpus: Optional[int] = None, launcher: Optional[str] = None, **knobs: Any) -> None:
    if launcher not in (None, "torchrun"):
        raise typer.BadParameter(f"--launcher must be torchrun, got {launcher!r}")
    if distributed.in_torchrun_worker():
        return _run_worker(until, redo or [], json_out, knobs)
    if gpus is not None or launcher == "torchrun":
        return _launch(gpus, until, redo or [], json_out, knobs)

    fresh = not knobs.get("resume")
    run = _open_or_create(**knobs)
    with discard_on_input_error(run, fresh):
        summaries = run_pipeline(run, stages=_stages_for(until), redo=redo or ())
    _print_result(summaries, run, json_out)


def _launch(gpus: Optional[int], until: Optional[str], redo: list[str], json_out: bool, knobs: dict[str, Any]) -> None:
    """Create the run here (a bad knob fails before any worker starts), then resume it in torchrun workers."""
    _stages_for(until)  # a bad --until fails here, not in every worker
    chosen: dict[str, int] = {}

    def check(config: Any) -> None:
        chosen["n"] = gpus if gpus is not None else distributed.default_nproc(config.device)
        distributed.check_nproc(chosen["n"], config.device)

    fresh = not knobs.get("resume")
    run = _open_or_create(check=check, **knobs)
    for stage in redo:  # here, once: the workers only resume
        redo_stage(run, stage)
    args = ["train", "run", "--run-id", run.run_id, "--resume", *(["--until", until] if until else []),
            *(["--json"] if json_out else [])]
    with discard_on_input_error(run, fresh):
        distributed.launch(chosen["n"], args, run.run_id)  # rank 0 prints the result


def _run_worker(until: Optional[str], redo: list[str], json_out: bool, knobs: dict[str, Any]) -> None:
    """One torchrun worker: rank 0 opens (or creates) the run and tells the others its id."""
    resume = knobs.get("resume")
    saved = Run.open(knobs["run_id"]).config if resume and knobs.get("run_id") else None
    world = distributed.init_world(resolve_device(knobs_to_config(dict(knobs), saved).device))
    try:
        run_id = world.broadcast(_open_or_create(**knobs).run_id if world.lead else None)
        run = Run.open(run_id)
        with note_input_error(run, world.lead):
            summaries = run_pipeline(run, stages=_stages_for(until), redo=redo if world.lead else (), world=world)
        if world.lead:
            _print_result(summaries, run, json_out)
    finally:
        distributed.close_world(world)


def run_cmd(**kwargs: Any) -> None:
    """Run the whole pipeline (or up to --until) for a new run, or --resume an existing one."""
    _run_command(**kwargs)


def prompts_cmd(**kwargs: Any) -> None:
    """Stage 1 only: read, filter (language, domain), deduplicate and split the prompts; creates the run."""
    _run_command(until="prompts", **kwargs)


def _with_signature(fn: Any, drop: tuple[str, ...] = ()) -> Any:
    sig = inspect.signature(knob_signature_source)
    fn.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in drop])
    return fn


app.command("run")(_with_signature(run_cmd))
app.command("prompts")(_with_signature(prompts_cmd, drop=("until", "redo", "gpus", "launcher")))


def _stage_command(stage: str, doc: str) -> None:
    def command(
        run_id: str = typer.Argument(..., help="The run (see `polyspec train list`)."),
        redo: bool = typer.Option(False, "--redo", help="Discard this stage's output and run it again."),
        json_out: bool = typer.Option(False, "--json", help="Print the stage summary as JSON."),
    ) -> None:
        run = Run.open(run_id)
        summaries = run_pipeline(run, stages=[stage], redo=[stage] if redo else ())
        _print_result(summaries, run, json_out)

    command.__doc__ = doc
    app.command(stage)(command)


for _stage, _doc in {
    "answers": "Stage 2: the verifier answers the training prompts (transformers, or --engine URL given at creation).",
    "hidden-states": "Stage 3: verifier hidden states (aux layers + pre-norm last) in speculators' offline format.",
    "vocab": "Stage 4: token frequencies, the draft vocabulary (t2d/d2t), coverage, the starting draft.",
    "fit": "Stage 5: train the Eagle3 draft; resumes from the last epoch checkpoint.",
    "evaluate": "Stage 6: acceptance on held-out prompts and MT-Bench, candidate vs the draft it started from.",
    "register": "Stage 7: record the candidate draft, its evaluations and provenance in the registry.",
}.items():
    _stage_command(_stage, _doc)


@app.command("status")
def status_cmd(run_id: str = typer.Argument(..., help="The run."),
               json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Show each stage of a run: done, partial (interrupted) or pending."""
    run = Run.open(run_id)
    rows = run.status()
    if json_out:
        typer.echo(json.dumps({"run_id": run_id, "stages": rows}))
        return
    table = Table(title=f"run {run_id} ({run.config.language}, {run.config.mode})")
    for col in ("stage", "state", "seconds", "finished at"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["stage"], r["state"], str(r["seconds"] or ""), str(r["finished_at"] or ""))
    Console().print(table)


@app.command("list")
def list_cmd(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List the runs under $POLYSPEC_HOME/runs."""
    root = runs_root()
    runs = [Run.open(p.name) for p in sorted(root.glob("*")) if (p / "run.json").is_file()] if root.is_dir() else []
    if json_out:
        typer.echo(json.dumps([{"run_id": r.run_id, "language": r.config.language, "mode": r.config.mode,
                                "done": [s["stage"] for s in r.status() if s["state"] == "done"]} for r in runs]))
        return
    for r in runs:
        done = [s["stage"] for s in r.status() if s["state"] == "done"]
        typer.echo(f"{r.run_id}\t{r.config.language}\t{r.config.mode}\tdone: {', '.join(done) or '-'}")


@app.callback()
def main(
    ctx: typer.Context,
    plan: Optional[str] = typer.Option(None, "--plan", metavar="LANG",
                                       help="Run the add-language plan the registry recorded for LANG: finetune "
                                       "(the active draft on LANG), from-scratch-custom-vocab (a LANG specialist, "
                                       "its own vocabulary) or extend-multilingual (the multilingual draft on its "
                                       "languages plus LANG; needs --prompts for its languages)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="With --plan: name of the run."),
    resume: bool = typer.Option(False, "--resume", help="With --plan: continue the run named by --run-id."),
    max_prompts: Optional[int] = typer.Option(None, "--max-prompts", help="With --plan: cap on training prompts."),
    engine: Optional[str] = typer.Option(None, "--engine", help="With --plan: vLLM engine URL for the answers."),
    prompts: Optional[list[Path]] = typer.Option(None, "--prompts", help="With an extend-multilingual --plan: prompt "
                                                 "files of the parent draft's languages, replayed beside LANG's "
                                                 "(repeatable; required)."),
    mix: Optional[str] = typer.Option(None, "--mix", help="With an extend-multilingual --plan: equal | traffic | "
                                      "LANG=WEIGHT,... (default: LANG 0.5, the parent's languages the rest equally)."),
    coverage_target: Optional[float] = typer.Option(None, "--coverage-target", help="With an extend-multilingual "
                                                    "--plan: share of each language's answer tokens the grown "
                                                    "vocabulary must hold (default 0.95)."),
    show: bool = typer.Option(False, "--show", help="With --plan: print the run config and stop."),
) -> None:
    """Train per-language Eagle3 drafts (see the sub-commands, or --plan LANG: finetune fine-tunes the active
    draft on LANG, from-scratch-custom-vocab trains a specialist with LANG's own vocabulary, extend-multilingual
    trains the multilingual draft on its languages plus LANG, its vocabulary grown within 25 MB)."""
    if ctx.invoked_subcommand is not None:
        return
    if plan is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    _plan(plan, run_id=run_id, resume=resume, max_prompts=max_prompts, engine=engine, prompts=prompts, mix=mix,
          coverage_target=coverage_target, show=show)


def _plan(language: str, **options: Any) -> None:
    show = options.pop("show")
    config = config_from_plan(language, **options)
    if show:
        typer.echo(config.model_dump_json(indent=2))
        return
    resolve_inputs(config)
    run = start_run(config, resume=options["resume"])
    with discard_on_input_error(run, fresh=not options["resume"]):
        summaries = run_pipeline(run)
    _print_result(summaries, run, as_json=False)


def register(root: typer.Typer) -> None:
    """Mount this package's commands on the root CLI."""
    root.add_typer(app, name="train")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
