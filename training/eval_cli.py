"""`polyspec eval`: acceptance of drafts on any benchmark file, per draft x language, all and non-degenerate."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from polyspec.core.atomic import atomic_write_json
from polyspec.core.console import console as make_console
from polyspec.registry import open_registry
from polyspec.training.benchmarks import load_benchmark, parse_turns, resolve_benchmark
from polyspec.training.eval_api import EvalOptionError, EvalOptions, run_eval
from polyspec.training.eval_drafts import resolve_drafts

HELP = """Measure how many draft tokens the verifier accepts, per draft and language, on any benchmark file.

BENCHMARK (--bench): a JSONL or text file in any format `polyspec registry add-language` reads (MT-Bench `turns`, `prompt`, `text`, OpenAI `messages`, or one prompt per line), or a bundled MT-Bench translation: mtbench:en, mtbench:fr, mtbench:de, mtbench:es, mtbench:it, mtbench:ru, mtbench:zh, mtbench:ja, mtbench:ko (80 questions x 2 turns each). Turn 2 of a multi-turn question is asked after the verifier's own answer to turn 1, as in MT-Bench. Bad files fail before any model loads, naming the line.

DRAFTS: one or more directories, registry references (NAME or NAME@VERSION) or names of drafts shipped in models/drafts. All are measured on the same verifier answers. A draft made for another verifier is refused.

LANGUAGE: --language, else the record's `lang` field, else detected per prompt (fastText, polyspec.core.langid). Figures are grouped per language.

METHODS: offline (default): teacher-forced chain acceptance with transformers, batched, on a GPU when there is one, else the CPU (float32). The verifier answers once; every draft is scored on those answers in a few batched passes. vllm: one live vLLM engine per draft (or --engine-url for a running one); the figures are the engine's own per-request histograms, cross-checked with its counters.

OUTPUT: per-position acceptance (P(at least i drafts accepted)) and the mean acceptance length MAL = 1 + sum of positions, each twice: over all answers and over NON-DEGENERATE answers only, plus the share of degenerate answers. An answer is degenerate when more than half of its tokens close a 4-gram seen earlier in the same answer (--degenerate ngram, the default), or, with --degenerate distinct, when its distinct-token ratio is below 0.3; docs/evaluation.md explains the choice. --json writes every figure (records with a `subset` field: all or non_degenerate) and one entry per answer. --record stores both subsets in the registry as evaluations named NAME-<number of items> (e.g. mtbench-160), unless --benchmark-name says otherwise; the drafts must then be registry drafts.

EXAMPLES

\b
  polyspec eval smollm2-135m-instruct-fr --bench mtbench:fr
  polyspec eval smollm2-135m-instruct-en smollm2-135m-instruct-fr -b mtbench:fr --turns 1 --limit 20
  polyspec eval ./runs/fr-1/fit/draft --bench my_prompts.jsonl --language fr --json fr.json
  polyspec eval fr-ft@2 --bench mtbench:fr --record
  polyspec eval fr-ft --bench mtbench:fr --method vllm --max-tokens 96 --limit 12
"""


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report_table(report: Any) -> Any:
    k = max((r.k for r in report.rows), default=0)
    table = Table(title=f"{report.benchmark} ({report.method}, k={k}, verifier {report.verifier}): "
                        "MAL = 1 + sum of per-position acceptance")
    cols = ["draft", "lang", "subset", *[f"pos {i}" for i in range(1, k + 1)], "MAL", "answers", "degenerate",
            "steps"]
    for col in cols:  # the draft name folds on a narrow terminal; the subset and the figures never do
        table.add_column(col, justify="left" if col in ("draft", "lang", "subset") else "right",
                         overflow="fold" if col == "draft" else "ellipsis", no_wrap=col != "draft",
                         min_width=len("non_degenerate") if col == "subset" else None)
    for r in report.rows:
        table.add_row(r.draft, r.language, r.subset, *[f"{a:.3f}" for a in r.acceptance],
                      _fmt(r.mean_acceptance_length), str(r.num_prompts), f"{r.degenerate_share:.0%}",
                      str(r.num_spec_steps))
    return table


def record_rows(report: Any, drafts: list[Any], benchmark: str) -> int:
    """Both subsets of every (draft, language) into the registry; rows without a verify step are skipped."""
    refs = {d.name: d.registry_ref for d in drafts}
    n = 0
    with open_registry() as reg:
        for r in report.rows:
            if r.mean_acceptance_length is None:
                continue
            reg.add_evaluation(
                refs[r.draft], benchmark=benchmark, language=r.language, k=r.k, acceptance=r.acceptance,
                mean_acceptance_length=r.mean_acceptance_length, num_prompts=r.num_prompts,
                num_tokens=r.num_tokens, method=report.method, subset=r.subset,
                degenerate_share=r.degenerate_share,
                details={"histogram": r.histogram, "num_spec_steps": r.num_spec_steps, "file": report.file,
                         "num_answers": r.num_answers, **{key: report.options[key] for key in
                                                         ("turns", "limit", "max_new_tokens", "degenerate_measure")}})
            n += 1
    return n


def eval_command(
    drafts: list[str] = typer.Argument(..., help="Draft directories, registry references or shipped draft names."),
    bench: str = typer.Option("mtbench:en", "--bench", "-b", help="Benchmark file, or mtbench:LANG (bundled)."),
    k: int = typer.Option(3, "--k", help="Draft tokens per verify step (num_speculative_tokens)."),
    turns: str = typer.Option("all", "--turns", help="Turns to score: 1, 2 or all."),
    method: str = typer.Option("offline", "--method", help="offline (teacher-forced, transformers) or vllm."),
    max_tokens: int = typer.Option(256, "--max-tokens", help="New tokens per answer."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N prompts (categories interleaved)."),
    language: Optional[str] = typer.Option(None, "--language", "-l", help="Language of every prompt (else per prompt)."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="Verifier (default: the drafts' own)."),
    degenerate: str = typer.Option("ngram", "--degenerate", help="Degenerate measure: ngram or distinct."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the full result here (JSON)."),
    record: bool = typer.Option(False, "--record", help="Store the figures as registry evaluations."),
    benchmark_name: Optional[str] = typer.Option(None, "--benchmark-name",
                                                 help="Name recorded in the registry (default: NAME-<items>)."),
    device: Optional[str] = typer.Option(None, "--device", help="offline: cuda or cpu (default: cuda if present)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="offline: bfloat16 or float32 (default: bf16 on GPU)."),
    batch_size: int = typer.Option(64, "--batch-size", help="offline: prompts per generation batch."),
    engine_url: Optional[str] = typer.Option(None, "--engine-url", help="vllm: a running engine serving the draft."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Errors are polyspec.core.errors subclasses; the root app (core.cli.guard) turns them into exit codes."""
    # OpenMP threads that spin while waiting make torch 8x slower on a CPU shared with other processes
    # (measured: 2.9 s vs 23 s for the same generation on 2 busy cores); passive waiting costs nothing when
    # the CPU is free. It only takes effect if torch is not imported yet, which is the case from the shell.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    options = EvalOptions(benchmark=bench, k=k, turns=turns, method=method, max_new_tokens=max_tokens, limit=limit,
                          language=language, degenerate_measure=degenerate, device=device, dtype=dtype,
                          batch_size=batch_size, engine_url=engine_url, progress=not quiet)
    options.check()
    parse_turns(turns)
    name, path = resolve_benchmark(bench)
    n_items = len(load_benchmark(path, turns, limit=limit))  # bad files fail here, before any model loads
    chosen, info = resolve_drafts(drafts, verifier)
    if record:
        missing = [d.name for d in chosen if d.registry_ref is None]
        if missing:
            raise EvalOptionError(f"--record needs registry drafts; not in the registry: {', '.join(missing)}",
                                  hint="add them with `polyspec registry import-draft`, then name them here")
    report = run_eval(chosen, info, options)
    console = make_console()
    console.print(report_table(report))
    console.print(f"{len(report.answers)} answers; seconds: {report.seconds}")
    if json_out is not None:
        atomic_write_json(json_out, report.to_json())
        console.print(f"wrote {json_out}")
    if record:
        n = record_rows(report, chosen, benchmark_name or f"{name}-{n_items}")
        console.print(f"recorded {n} evaluations in the registry")


def register(root: typer.Typer) -> None:
    root.command("eval", help=HELP, no_args_is_help=True)(eval_command)
