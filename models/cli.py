"""`polyspec models ...`: prepare, list and resolve verifiers; inspect, list, pull and push drafts.

Imports of the models modules stay inside the commands so `polyspec --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from polyspec.core.cli import PolyspecTyper
from polyspec.models.drafts import inspect_draft
from polyspec.models.hub import pull_draft, push_draft
from polyspec.models.shipped import SHIPPED_DIR, DraftNotFound, ShippedDraftError, shipped_drafts
from polyspec.models.verifiers import list_prepared, prepare_verifier, resolve_verifier

app = PolyspecTyper(name="models", help="Verifier models and draft files (prepare, list, inspect, pull, push).",
                    no_args_is_help=True)
_err = Console(stderr=True)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


@app.command("prepare")
def prepare(
    name: str = typer.Argument("smollm2-135m-instruct", help="Alias of a bundled verifier."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if a prepared copy exists."),
    home: Optional[Path] = typer.Option(None, "--home", help="Override POLYSPEC_HOME."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Download, check and convert a bundled verifier into POLYSPEC_HOME/models/NAME."""
    info = prepare_verifier(name, home=home, force=force)
    if as_json:
        typer.echo(json.dumps(info.to_json(), indent=2))
    else:
        Console().print(
            f"[green]ok[/green] {info.name}: {info.architecture}, {info.num_layers} layers, hidden {info.hidden_size}, "
            f"vocab {info.vocab_size} at {info.path}"
        )


@app.command("list")
def list_cmd(
    home: Optional[Path] = typer.Option(None, "--home", help="Override POLYSPEC_HOME."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """List the prepared verifiers."""
    infos = list_prepared(home)
    if as_json:
        typer.echo(json.dumps([i.to_json() for i in infos], indent=2))
        return
    if not infos:
        Console().print("no prepared verifiers; run `polyspec models prepare`")
        return
    table = Table(title="prepared verifiers")
    for col in ("name", "architecture", "vocab", "layers", "hidden", "size", "path"):
        table.add_column(col, justify="right" if col in ("vocab", "layers", "hidden", "size") else "left")
    for i in infos:
        table.add_row(
            i.name, i.architecture, str(i.vocab_size), str(i.num_layers), str(i.hidden_size), _human(i.size_bytes), str(i.path)
        )
    Console().print(table)


@app.command("resolve")
def resolve(
    spec: str = typer.Argument(..., help="Alias, local model directory or Hugging Face id."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Show which model a verifier spec resolves to (preparing or downloading it if needed)."""
    info = resolve_verifier(spec)
    if as_json:
        typer.echo(json.dumps(info.to_json(), indent=2))
    else:
        Console().print(f"{spec} -> {info.path} ({info.architecture}, vocab {info.vocab_size}, {info.num_layers} layers)")


@app.command("inspect-draft")
def inspect_draft_cmd(
    path: Path = typer.Argument(..., help="Directory of a speculators Eagle3 draft."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="Check the draft against this verifier spec."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Validate a draft directory and print its shape (architecture, vocabularies, layers)."""
    ver = resolve_verifier(verifier) if verifier else None
    info = inspect_draft(path, ver)
    data = info.to_json()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(title=f"draft {path}", show_header=False)
    for key, value in data.items():
        table.add_row(key, str(value))
    Console().print(table)


def _checked(draft: Any) -> str:
    """"verified" when every file matches the recorded sha256, else what is wrong (missing or damaged)."""
    try:
        draft.verify()
    except DraftNotFound:
        return "weights missing"
    except ShippedDraftError as exc:
        return str(exc).split(": ", 1)[-1]
    return "verified"


@app.command("drafts")
def drafts_cmd(
    home: Optional[Path] = typer.Option(None, "--home", help="Override POLYSPEC_HOME."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """List the drafts available here: the checkout's (models/drafts) and those pulled into POLYSPEC_HOME, each
    with its files checked against the recorded sha256."""
    drafts = shipped_drafts(home=home)
    rows = [{"name": d.name, "verifier": d.verifier, "languages": d.languages, "role": d.role, "parent": d.parent,
             "where": "checkout" if d.path.parent == SHIPPED_DIR else "pulled", "sha256": _checked(d),
             "path": str(d.path)} for d in drafts]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        Console().print("no drafts here; get one with `polyspec models pull NAME --from <Hugging Face repo id or directory>`")
        return
    table = Table(title="drafts (--json for the paths)")
    for col in ("name", "verifier", "languages", "role", "parent", "where", "sha256"):
        table.add_column(col, no_wrap=col == "name")
    for r in rows:
        mark = "[green]verified[/]" if r["sha256"] == "verified" else f"[red]{r['sha256']}[/]"
        table.add_row(r["name"], r["verifier"], ",".join(r["languages"]), r["role"], r["parent"] or "—", r["where"], mark)
    Console(width=max(140, Console().width)).print(table)


@app.command("pull")
def pull_cmd(
    name_or_repo: str = typer.Argument(..., help="Draft name (with --from), or a Hugging Face repo id owner/name."),
    source: Optional[str] = typer.Option(
        None, "--from", help="Where from: a directory (a draft, or a mirror holding NAME/), file://PATH, or a Hugging "
                             "Face repo id (owner/name or hf://owner/name; HF_ENDPOINT selects a Hub mirror)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch, tag or commit (Hugging Face only)."),
    sha256: Optional[str] = typer.Option(None, "--sha256", help="Expected sha256 of model.safetensors, from a "
                                                                "source you trust."),
    home: Optional[Path] = typer.Option(None, "--home", help="Override POLYSPEC_HOME."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Fetch a draft, verify its sha256 and install it into POLYSPEC_HOME/drafts/NAME (atomically)."""
    done = pull_draft(name_or_repo, source, revision=revision, sha256=sha256, home=home)
    checked = (f"sha256 verified against {', '.join(done.verified_against)}" if done.verified_against
               else "[yellow]no checksums published with it: recorded the sha256 of what was fetched[/yellow]")
    _done(done, as_json, f"pulled {done.name} from {done.source} into {done.destination} "
                         f"({_human(done.size_bytes)}, {checked})")


@app.command("push")
def push_cmd(
    name: str = typer.Argument(..., help="Draft name (from the checkout or POLYSPEC_HOME/drafts)."),
    to: str = typer.Option(..., "--to", help="A directory (the draft goes to DIR/NAME), file://PATH, or a Hugging Face "
                                             "repo id (owner/name or hf://owner/name)."),
    license: str = typer.Option("apache-2.0", "--license", help="License for the model card."),
    base_model: Optional[str] = typer.Option(None, "--base-model", help="Hub id of the verifier for the model card "
                                                                        "(default: derived from the draft's verifier)."),
    home: Optional[Path] = typer.Option(None, "--home", help="Override POLYSPEC_HOME."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Publish a draft with a model card (README.md) and its manifest entry, to a directory or the Hub."""
    done = push_draft(name, to, license=license, base_model=base_model, home=home)
    _done(done, as_json, f"pushed {done.name} to {done.destination} ({_human(done.size_bytes)}: "
                         f"{', '.join(sorted(done.files))})")


def _done(transfer: Any, as_json: bool, line: str) -> None:
    if as_json:
        typer.echo(json.dumps(transfer.to_json(), indent=2))
    else:
        Console().print(f"[green]ok[/green] {line}", highlight=False, soft_wrap=True)


def register(root: typer.Typer) -> None:
    """Mount this package's commands on the root CLI."""
    root.add_typer(app, name="models")


