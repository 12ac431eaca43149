"""Deployment, language, telemetry and transfer commands of `polyspec registry`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from polyspec.registry.cli_base import JsonOpt, VerifierOpt, _dump, _fmt_mal, _kv, _reg, _table, app
from polyspec.registry.errors import ImportFailed, RegistryError
from polyspec.registry.profiles import DEFAULT_COVERAGE_THRESHOLD


@app.command("deployments")
def list_deployments(include_stopped: bool = typer.Option(False, "--all", help="Include stopped deployments."),
                     as_json: bool = JsonOpt) -> None:
    """List deployments (what the router serves)."""
    rows = _reg().deployments(include_stopped=include_stopped)
    if as_json:
        return _dump(rows)
    _table("deployments", ["name", "status", "draft", "languages", "domain", "default", "engine", "offline mean acc. len."],
           [[d.name, d.status, d.draft or "(no draft)", ",".join(d.languages), d.domain, "yes" if d.is_default else "",
             d.url or ("launch " + json.dumps(d.launch) if d.launch else "launch (defaults)"), _fmt_mal(d.offline_mal)]
            for d in rows])


@app.command("deploy")
def deploy(draft: Optional[str] = typer.Argument(None, metavar="[NAME[@VERSION]]",
                                                 help="Draft to serve; omit to serve the verifier alone."),
           name: str = typer.Option(..., "--name", help="Deployment name (unique among active ones)."),
           url: Optional[str] = typer.Option(None, help="A running engine, e.g. http://host:8000."),
           launch: Optional[str] = typer.Option(None, help="Launch spec JSON for `polyspec up` "
                                                '(e.g. \'{"port": 8101, "kv_cache_gib": 2}\').'),
           languages: Optional[str] = typer.Option(None, "--languages", "-l", help="Served languages "
                                                   "(default: the draft's)."),
           domain: str = typer.Option("general"),
           default: bool = typer.Option(False, "--default", help="Serve languages no other deployment serves."),
           verifier: Optional[str] = VerifierOpt,
           as_json: bool = JsonOpt) -> None:
    """Deploy a draft (or the bare verifier) at an engine URL or with a launch spec."""
    try:
        spec = json.loads(launch) if launch else None
    except ValueError as exc:
        raise RegistryError(f"--launch is not valid JSON: {exc}") from exc
    if spec is not None and not isinstance(spec, dict):
        raise RegistryError("--launch must be a JSON object")
    d = _reg().deploy(draft, name=name, url=url, launch=spec, languages=languages, domain=domain, default=default,
                      verifier=verifier)
    if as_json:
        return _dump(d)
    typer.echo(f"deployed {d.name}: {d.draft or 'no draft'} for {','.join(d.languages) or 'default'}"
               f"/{d.domain}{' (default)' if d.is_default else ''} at {d.url or 'launch spec'}")


@app.command("undeploy")
def undeploy(name: str, as_json: bool = JsonOpt) -> None:
    """Stop routing to a deployment (kept in history as stopped)."""
    d = _reg().undeploy(name)
    if as_json:
        return _dump(d)
    typer.echo(f"undeployed {d.name}")


@app.command("languages")
def list_languages(verifier: Optional[str] = typer.Option(None, "--verifier", "-v"), as_json: bool = JsonOpt) -> None:
    """List language profiles and their plans."""
    rows = _reg().languages(verifier=verifier)
    if as_json:
        return _dump(rows)
    short = {"measured": "measured", "predicted": "predicted", "predicted-unseen-script": "unseen script"}
    _table("language profiles", ["language", "name", "verifier", "script", "best draft", "mean acc. len.", "coverage",
                                 "plan"],
           [[p.language, p.name, p.verifier, p.script, p.coverage_reference,
             "-" if p.acceptance is None else f"{p.acceptance:.2f} {short.get(p.acceptance_basis or '', '')}",
             f"{p.coverage:.1%}", p.plan] for p in rows])


@app.command("show-language")
def show_language(code: str, verifier: Optional[str] = typer.Option(None, "--verifier", "-v"),
                  as_json: bool = JsonOpt) -> None:
    """Show one language profile."""
    p = _reg().get_language(code, verifier=verifier)
    if as_json:
        return _dump(p)
    _kv(f"language {p.language} ({p.name})", p.model_dump())


@app.command("add-language")
def add_language(lang: str = typer.Argument(..., metavar="LANG", help="ISO 639-1 or 639-3 code (fr, fra)."),
                 prompts: Optional[Path] = typer.Option(None, "--prompts", help="The language's prompts (JSONL: "
                                                        "prompt/turns/messages, or one per line), recorded for "
                                                        "`polyspec train --plan`; coverage uses them when no sample "
                                                        "of the language is bundled."),
                 verifier: Optional[str] = VerifierOpt,
                 threshold: Optional[float] = typer.Option(None, help="Coverage below which a language gets a "
                                                           "specialist with its own vocabulary (0-1)."),
                 shipped: bool = typer.Option(True, "--shipped/--no-shipped", help="Also weigh the shipped drafts "
                                              "that are not in the registry."),
                 as_json: bool = JsonOpt) -> None:
    """Which existing draft covers a language (measured or predicted acceptance, vocabulary coverage, script),
    and the plan: extend the multilingual draft, fine-tune, or train a specialist from scratch."""
    opts = {"threshold": threshold if threshold is not None else DEFAULT_COVERAGE_THRESHOLD, "shipped": shipped}
    reg = _reg()
    if as_json:
        return _dump(reg.add_language(lang, prompts, verifier, **opts))

    with Console(stderr=True).status(f"profiling {lang}: script, vocabulary coverage, acceptance..."):
        p = reg.add_language(lang, prompts, verifier, **opts)
    typer.echo(f"{p.language} ({p.name}): {p.script} script{'' if p.is_latin else ' (not Latin)'}, measured on "
               f"the {p.text or 'prompts'}")
    if p.fits:
        _table(f"drafts of {p.verifier} on {p.language}", ["draft", "made for", "covers script", "coverage",
                                                          "mean acc. len.", "basis"],
               [[f["draft"], ",".join(f["languages"]) if len(f["languages"]) <= 3 else f"{len(f['languages'])} languages",
                 "yes" if f["covers_script"] else "no", f"{f['coverage']:.1%}",
                 "-" if f["acceptance"] is None else f"{f['acceptance']:.2f}",
                 f["basis"] + (f" (from {f['reference']})" if f["basis"] == "predicted" else "")] for f in p.fits])
        acc = "no figure" if p.acceptance is None else f"{p.acceptance_basis} mean acceptance length {p.acceptance:.2f}"
        lead = "covered best by" if p.fits[0]["covers_script"] else f"no draft is made for {p.script} script; best"
        typer.echo(f"{lead}: {p.draft} ({acc}, coverage {p.coverage:.1%})")
    else:
        typer.echo(f"no draft for {p.verifier} yet: coverage {p.coverage:.1%} against {p.coverage_reference}")
    typer.echo(f"plan: {p.plan} -- {p.reason}")


@app.command("live-stats")
def live_stats(router: Optional[str] = typer.Option(None, help="One router's counters (default: all summed)."),
               as_json: bool = JsonOpt) -> None:
    """Acceptance measured by the routers, per language, domain and draft."""
    rows = _reg().live_stats(router_id=router)
    if as_json:
        return _dump([{**r.model_dump(), "mean_acceptance_length": r.mean_acceptance_length} for r in rows])
    _table("live acceptance", ["language", "domain", "draft", "requests", "tokens", "spec steps", "mean acc. len."],
           [[r.language, r.domain, r.draft_name, r.requests, r.completion_tokens, r.num_spec_steps,
             f"{r.mean_acceptance_length:.3f}" if r.mean_acceptance_length else "-"] for r in rows])


@app.command("events")
def events(limit: int = typer.Option(50, help="How many, newest first."), as_json: bool = JsonOpt) -> None:
    """Audit trail: promotions (forced ones marked), retirements, deployments."""
    rows = _reg().events(limit)
    if as_json:
        return _dump(rows)
    _table("events", ["when", "kind", "subject"], [[e.created_at, e.kind, e.subject] for e in rows])


@app.command("export")
def export(out: Optional[Path] = typer.Argument(None, help="File to write (default: stdout).")) -> None:
    """Export the whole registry as JSON."""
    text = json.dumps(_reg().export_json(), indent=2, ensure_ascii=False)
    if out is None:
        sys.stdout.write(text + "\n")
        return
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(out)  # atomic: a crash never leaves half an export
    typer.echo(f"exported to {out}", err=True)


@app.command("import")
def import_(src: Path = typer.Argument(..., help="A file written by `polyspec registry export`."),
            as_json: bool = JsonOpt) -> None:
    """Merge an export into this registry (all or nothing; identical rows are skipped)."""
    try:
        data = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ImportFailed(f"cannot read {src}: {exc}") from exc
    if not isinstance(data, dict):
        raise ImportFailed(f"{src} is not a registry export")
    added = _reg().import_json(data)
    if as_json:
        return _dump(added)
    typer.echo("imported: " + ", ".join(f"{v} {k}" for k, v in added.items()))
