"""`polyspec registry ...`: list, show, add and change what the registry holds.

Naming: plural nouns list (`drafts`, `evaluations`), `show-NOUN` shows one, `add-NOUN`/`import-draft`
create, verbs act (`promote`, `retire`, `deploy`, `undeploy`, `verify`, `export`, `import`).
Every command takes `--json` for machine-readable output. Imports stay inside commands so that
`polyspec --help` is fast.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, Optional

import typer

app = typer.Typer(name="registry", help="Verifiers, drafts, evaluations, deployments and language profiles.",
                  no_args_is_help=True)
_state: dict[str, Optional[str]] = {"url": None}
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")
VerifierOpt = typer.Option(None, "--verifier", "-v", help="Verifier name (default: POLYSPEC_DEFAULT_VERIFIER).")


def register(root: typer.Typer) -> None:
    """Mount this package's commands on the root CLI."""
    root.add_typer(app, name="registry")


@app.callback()
def _main(url: Optional[str] = typer.Option(None, "--url", help="Registry URL (default: POLYSPEC_REGISTRY_URL "
                                            "or a SQLite file in POLYSPEC_HOME).")) -> None:
    _state["url"] = url


def _reg():  # noqa: ANN202 - registry.Registry, imported lazily
    from registry import open_registry

    return open_registry(_state["url"])


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Registry errors become one line on stderr (and a JSON object with --json) and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from registry.errors import PromotionRefused, RegistryError, UnknownLanguage

        try:
            return fn(*args, **kwargs)
        except RegistryError as exc:
            if kwargs.get("as_json"):
                payload: dict[str, Any] = {"error": str(exc), "kind": type(exc).__name__}
                if isinstance(exc, UnknownLanguage):
                    payload["suggestions"] = exc.suggestions
                if isinstance(exc, PromotionRefused):
                    payload["failures"] = exc.failures
                typer.echo(json.dumps(payload, ensure_ascii=False))
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def _dump(obj: Any) -> None:
    def conv(o: Any) -> Any:
        if hasattr(o, "model_dump"):
            return o.model_dump(mode="json")
        if isinstance(o, list):
            return [conv(x) for x in o]
        if isinstance(o, dict):
            return {k: conv(v) for k, v in o.items()}
        return o

    typer.echo(json.dumps(conv(obj), indent=2, ensure_ascii=False, default=str))


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for i, col in enumerate(columns):
        table.add_column(col, no_wrap=i == 0)  # names and refs stay greppable on narrow terminals
    for row in rows:
        table.add_row(*["" if v is None else str(v) for v in row])
    # Piped output keeps whole names instead of rich's 80-column default; use --json for parsing.
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def _kv(title: str, items: dict[str, Any]) -> None:
    _table(title, ["field", "value"], [[k, v if not isinstance(v, (dict, list)) else json.dumps(v, ensure_ascii=False)]
                                        for k, v in items.items()])


def _fmt_mal(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in d.items())


# -- verifiers ------------------------------------------------------------------------------
@app.command("verifiers")
@handles_errors
def list_verifiers(as_json: bool = JsonOpt) -> None:
    """List registered verifiers."""
    rows = _reg().verifiers()
    if as_json:
        return _dump(rows)
    _table("verifiers", ["name", "architecture", "vocab", "hidden", "layers", "location"],
           [[v.name, v.architecture, v.vocab_size, v.hidden_size, v.num_layers, v.location] for v in rows])


@app.command("show-verifier")
@handles_errors
def show_verifier(name: str, as_json: bool = JsonOpt) -> None:
    """Show one verifier."""
    v = _reg().get_verifier(name)
    if as_json:
        return _dump(v)
    _kv(f"verifier {v.name}", {**v.model_dump(exclude={"checksums"}), "files": len(v.checksums)})


@app.command("add-verifier")
@handles_errors
def add_verifier(spec: str = typer.Argument(..., help="Alias (smollm2-135m-instruct), local dir or hub id."),
                 name: Optional[str] = typer.Option(None, help="Registry name (default: the resolved name)."),
                 as_json: bool = JsonOpt) -> None:
    """Register a verifier resolved from an alias, a local directory or a hub id."""
    v = _reg().add_verifier(spec, name=name)
    if as_json:
        return _dump(v)
    typer.echo(f"verifier {v.name}: {v.architecture}, vocab {v.vocab_size}, {v.num_layers} layers at {v.location}")


from registry import cli_drafts as _drafts  # noqa: E402,F401  (mounts the draft, deployment and language commands)
