"""`polyspec registry ...`: the verifier commands here; drafts, evaluations and promotion in cli_drafts;
deployments, languages and transfer in cli_ops. Each module adds its commands to the one app of cli_base.
"""

from __future__ import annotations

from typing import Optional

import typer

from polyspec.registry import cli_drafts, cli_ops  # noqa: F401  (importing them registers their commands)
from polyspec.registry import db
from polyspec.registry.cli_base import JsonOpt, _dump, _kv, _reg, _table, app


def register(root: typer.Typer) -> None:
    """Mount this package's commands on the root CLI."""
    root.add_typer(app, name="registry")


@app.command("init")
def init(as_json: bool = JsonOpt) -> None:
    """Create the registry (or migrate an existing one to the current schema) and say where it is.

    The router and its dashboard never create a registry: a missing one is an error they report.
    """
    reg = _reg()
    with reg.engine.connect() as conn:
        revision = db.current_revision(conn)
    info = {"url": reg.engine.url.render_as_string(hide_password=True), "revision": revision,
            "verifiers": len(reg.verifiers()), "drafts": len(reg.drafts())}
    if as_json:
        return _dump(info)
    _kv("registry", info)


@app.command("verifiers")
def list_verifiers(as_json: bool = JsonOpt) -> None:
    """List registered verifiers."""
    rows = _reg().verifiers()
    if as_json:
        return _dump(rows)
    _table("verifiers", ["name", "architecture", "vocab", "hidden", "layers", "location"],
           [[v.name, v.architecture, v.vocab_size, v.hidden_size, v.num_layers, v.location] for v in rows])


@app.command("show-verifier")
def show_verifier(name: str, as_json: bool = JsonOpt) -> None:
    """Show one verifier."""
    v = _reg().get_verifier(name)
    if as_json:
        return _dump(v)
    _kv(f"verifier {v.name}", {**v.model_dump(exclude={"checksums"}), "files": len(v.checksums)})


@app.command("add-verifier")
def add_verifier(spec: str = typer.Argument(..., help="Alias (smollm2-135m-instruct), local dir or hub id."),
                 name: Optional[str] = typer.Option(None, help="Registry name (default: the resolved name)."),
                 as_json: bool = JsonOpt) -> None:
    """Register a verifier resolved from an alias, a local directory or a hub id."""
    v = _reg().add_verifier(spec, name=name)
    if as_json:
        return _dump(v)
    typer.echo(f"verifier {v.name}: {v.architecture}, vocab {v.vocab_size}, {v.num_layers} layers at {v.location}")
