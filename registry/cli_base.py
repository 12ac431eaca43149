"""The `polyspec registry` app and the helpers its command modules share (output, the open registry).

`polyspec registry ...` lists, shows, adds and changes what the registry holds.

Naming: plural nouns list (`drafts`, `evaluations`), `show-NOUN` shows one, `add-NOUN`/`import-draft`
create, verbs act (`promote`, `retire`, `deploy`, `undeploy`, `verify`, `export`, `import`).
Every command takes `--json` for machine-readable output. Imports stay inside commands so that
`polyspec --help` is fast.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.table import Table

from polyspec.core.cli import PolyspecTyper
from polyspec.core.console import console
from polyspec.registry import open_registry

app = PolyspecTyper(name="registry", help="Verifiers, drafts, evaluations, deployments and language profiles.",
                  no_args_is_help=True)
_state: dict[str, Optional[str]] = {"url": None}
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")
VerifierOpt = typer.Option(None, "--verifier", "-v", help="Verifier name (default: POLYSPEC_DEFAULT_VERIFIER).")


@app.callback()
def _main(url: Optional[str] = typer.Option(None, "--url", help="Registry URL (default: POLYSPEC_REGISTRY_URL "
                                            "or a SQLite file in POLYSPEC_HOME).")) -> None:
    _state["url"] = url


def _reg():  # noqa: ANN202 - a registry.Registry
    return open_registry(_state["url"])


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
    table = Table(title=title, show_lines=False)
    for i, col in enumerate(columns):
        table.add_column(col, no_wrap=i == 0)  # names and refs stay greppable on narrow terminals
    for row in rows:
        table.add_row(*["" if v is None else str(v) for v in row])
    # Piped output keeps whole names instead of rich's 80-column default; use --json for parsing.
    console().print(table)


def _kv(title: str, items: dict[str, Any]) -> None:
    _table(title, ["field", "value"], [[k, v if not isinstance(v, (dict, list)) else json.dumps(v, ensure_ascii=False)]
                                        for k, v in items.items()])


def _fmt_mal(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in d.items())


# -- verifiers ------------------------------------------------------------------------------
