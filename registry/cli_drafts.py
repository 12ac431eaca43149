"""Draft and evaluation commands of `polyspec registry` (mounted by registry/cli.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from polyspec.registry.cli_base import JsonOpt, VerifierOpt, _dump, _fmt_mal, _kv, _reg, _table, app
from polyspec.registry.errors import InvalidEvaluation, RegistryError


@app.command("drafts")
def list_drafts(verifier: Optional[str] = typer.Option(None, "--verifier", "-v", help="Only this verifier's drafts."),
                language: Optional[str] = typer.Option(None, "--language", "-l", help="Only drafts serving it."),
                status: Optional[str] = typer.Option(None, help="candidate, active or retired."),
                as_json: bool = JsonOpt) -> None:
    """List drafts (every version)."""
    reg = _reg()
    rows = reg.drafts(verifier=verifier, language=language, status=status)
    if as_json:
        return _dump(rows)
    best: dict[str, dict[str, float]] = {}
    for ev in reg.best_evaluations():
        best.setdefault(ev.draft, {})[ev.language] = ev.mean_acceptance_length
    _table("drafts", ["draft", "status", "verifier", "languages", "domain", "vocab", "k", "best mean acc. len."],
           [[d.ref, d.status, d.verifier, ",".join(d.languages), d.domain, d.draft_vocab_size, d.k,
             _fmt_mal(best.get(d.ref, {}))] for d in rows])


@app.command("show-draft")
def show_draft(draft: str = typer.Argument(..., metavar="NAME[@VERSION]", help="Newest version when omitted."),
               as_json: bool = JsonOpt) -> None:
    """Show one draft with its evaluations."""
    reg = _reg()
    d = reg.get_draft(draft)
    evals = reg.evaluations(d.ref)
    if as_json:
        return _dump({"draft": d, "evaluations": evals})
    _kv(f"draft {d.ref}", {**d.model_dump(exclude={"checksums"}), "files": len(d.checksums)})
    _evals_table(evals)


def _evals_table(evals: list) -> None:  # noqa: ANN001 - list[EvaluationRecord]
    _table("evaluations", ["draft", "benchmark", "lang", "method", "k", "acceptance", "mean acc. len.", "prompts",
                           "tokens"],
           [[e.draft, e.benchmark, e.language, e.method, e.k, " ".join(f"{a:.3f}" for a in e.acceptance),
             f"{e.mean_acceptance_length:.3f}", e.num_prompts, e.num_tokens] for e in evals])


@app.command("import-draft")
def import_draft(path: str = typer.Argument(..., help="Draft directory (speculators Eagle3) or hub id."),
                 name: str = typer.Option(..., "--name", help="Draft name; a new version when it exists."),
                 languages: str = typer.Option(..., "--languages", "-l", help="Comma-separated ISO codes: fr,en."),
                 verifier: Optional[str] = VerifierOpt,
                 domain: str = typer.Option("general", help="general, math, code, medical, ..."),
                 k: int = typer.Option(3, help="num_speculative_tokens the draft was made for."),
                 parent: Optional[str] = typer.Option(None, help="Parent draft NAME[@VERSION] (fine-tunes)."),
                 provenance: Optional[Path] = typer.Option(None, help="JSON file: data, recipe, hparams, code."),
                 status: str = typer.Option("candidate", help="candidate (default), active or retired."),
                 as_json: bool = JsonOpt) -> None:
    """Validate a draft against its verifier, checksum every file and record it as a candidate."""
    prov = None
    if provenance is not None:
        try:
            prov = json.loads(provenance.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RegistryError(f"cannot read provenance {provenance}: {exc}") from exc
    reg = _reg()
    ver = verifier or reg.ensure_verifier(None).name
    d = reg.import_draft(path, verifier=ver, name=name, languages=languages, domain=domain, k=k, parent=parent,
                         provenance=prov, status=status)
    if as_json:
        return _dump(d)
    typer.echo(f"imported {d.ref} ({d.status}): {','.join(d.languages)}/{d.domain}, draft vocab "
               f"{d.draft_vocab_size}, {len(d.checksums)} files checksummed")


@app.command("evaluations")
def list_evaluations(draft: Optional[str] = typer.Argument(None, metavar="[NAME[@VERSION]]"),
                     language: Optional[str] = typer.Option(None, "--language", "-l"),
                     benchmark: Optional[str] = typer.Option(None),
                     method: Optional[str] = typer.Option(None, help="offline, vllm or live."),
                     as_json: bool = JsonOpt) -> None:
    """List evaluations, optionally of one draft."""
    evals = _reg().evaluations(draft, language=language, benchmark=benchmark, method=method)
    if as_json:
        return _dump(evals)
    _evals_table(evals)


@app.command("add-evaluation")
def add_evaluation(draft: str = typer.Argument(..., metavar="NAME[@VERSION]"),
                   benchmark: str = typer.Option(..., help="e.g. mtbench, heldout."),
                   language: str = typer.Option(..., "--language", "-l"),
                   acceptance: str = typer.Option(..., help="P(>= i accepted) per position: 0.6,0.4,0.2."),
                   method: str = typer.Option("offline", help="offline, vllm or live."),
                   domain: str = typer.Option("general"),
                   prompts: int = typer.Option(0, help="Number of prompts evaluated."),
                   tokens: int = typer.Option(0, help="Number of generated tokens."),
                   as_json: bool = JsonOpt) -> None:
    """Record a measured acceptance curve for a draft (k = number of positions)."""
    try:
        acc = [float(x) for x in acceptance.split(",") if x.strip()]
    except ValueError as exc:
        raise InvalidEvaluation(f"--acceptance must be comma-separated numbers: {acceptance!r}") from exc
    ev = _reg().add_evaluation(draft, benchmark=benchmark, language=language, k=len(acc), acceptance=acc,
                               method=method, domain=domain, num_prompts=prompts, num_tokens=tokens)
    if as_json:
        return _dump(ev)
    typer.echo(f"{ev.draft} {ev.language} {ev.benchmark}/{ev.method}: mean acceptance length "
               f"{ev.mean_acceptance_length:.3f}")


@app.command("promote")
def promote(draft: str = typer.Argument(..., metavar="NAME[@VERSION]"),
            languages: Optional[str] = typer.Option(None, "--languages", "-l",
                                                    help="Target languages (default: the draft's)."),
            delta: float = typer.Option(0.02, help="Required gain in mean acceptance length on each target."),
            epsilon: float = typer.Option(0.02, help="Tolerated loss on any other evaluated language."),
            replace: bool = typer.Option(False, "--replace", help="Retire the active drafts it supersedes and "
                                         "move their locally launched deployments to it."),
            force: bool = typer.Option(False, "--force", help="Promote despite the gate (recorded)."),
            gain_on: Optional[list[str]] = typer.Option(
                None, "--gain-on", metavar="BENCHMARK", help="Require the gain on this benchmark only (repeat for "
                "more); the targets' other benchmarks must then not lose more than --epsilon. Default: all."),
            as_json: bool = JsonOpt) -> None:
    """Make a candidate active if it beats the active draft(s) on its languages and hurts no other."""
    res = _reg().promote(draft, languages=languages, delta=delta, epsilon=epsilon, force=force, replace=replace,
                         gain_on=gain_on or None)
    if as_json:
        return _dump(res)
    _table(f"promotion gate for {res.draft}", ["language", "benchmark", "method", "k", "baseline", "before",
                                               "after", "change", "ok"],
           [[c["language"], c.get("benchmark"), c.get("method"), c.get("k"), c.get("baseline") or "(none: first draft)",
             c.get("before"), c.get("after"), c.get("change"), "yes" if c["passed"] else "NO"]
            for c in res.comparisons])
    verdict = "FORCED (gate failed: " + "; ".join(res.failures) + ")" if res.forced else "passed"
    typer.echo(f"{res.draft} is now active ({verdict})")
    for old in res.retired:
        typer.echo(f"retired {old}")
    for dep in res.repointed_deployments:
        typer.echo(f"deployment {dep} now uses {res.draft}")


@app.command("retire")
def retire(draft: str = typer.Argument(..., metavar="NAME[@VERSION]"), as_json: bool = JsonOpt) -> None:
    """Retire a draft (refused while a deployment uses it)."""
    d = _reg().retire(draft)
    if as_json:
        return _dump(d)
    typer.echo(f"retired {d.ref}")


@app.command("verify")
def verify(draft: Optional[str] = typer.Argument(None, metavar="[NAME[@VERSION]]", help="Default: every draft."),
           as_json: bool = JsonOpt) -> None:
    """Re-check the sha256 of every file of a draft (or of all drafts). Exit status 1 on any problem."""
    report = _reg().verify_draft(draft)
    bad = {k: v for k, v in report.items() if v}
    if as_json:
        _dump({"ok": not bad, "drafts": report})
    else:
        _table("checksums", ["draft", "status"], [[k, "; ".join(v) if v else "ok"] for k, v in report.items()])
    if bad:
        typer.echo(f"error: {len(bad)} draft(s) changed on disk: {', '.join(bad)}", err=True)
        raise typer.Exit(1)
