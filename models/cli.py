"""`polyspec models ...`: prepare, list and resolve verifiers; inspect drafts.

Imports of the models modules stay inside the commands so `polyspec --help` stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

app = typer.Typer(name="models", help="Verifier models and draft files (prepare, list, inspect).", no_args_is_help=True)
_err = Console(stderr=True)


@contextmanager
def _clean_errors() -> Iterator[None]:
    """Turn the models package's own errors into one red line and exit status 1."""
    from models.drafts import DraftError
    from models.verifiers import VerifierError

    try:
        yield
    except (VerifierError, DraftError) as exc:
        _err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


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
    from models.verifiers import prepare_verifier

    with _clean_errors():
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
    from rich.table import Table

    from models.verifiers import list_prepared

    with _clean_errors():
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
    from models.verifiers import resolve_verifier

    with _clean_errors():
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
    from rich.table import Table

    from models.drafts import inspect_draft
    from models.verifiers import resolve_verifier

    with _clean_errors():
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


def register(root: typer.Typer) -> None:
    """Mount this package's commands on the root CLI."""
    root.add_typer(app, name="models")


