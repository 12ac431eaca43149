"""`polyspec deploy k8s`: Kubernetes manifests for the registry's active deployments (or, with --example,
for the shipped drafts; with --plan, for a fleet plan's deployments and replicas). Mounted on the `deploy` group of polyspec.registry.cli_plan: the command joins the
registry with models (the engine command line) and the router's settings, so it lives in the app layer."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
import yaml
from sqlalchemy.engine import make_url

from polyspec.core.errors import InvalidInput
from polyspec.core.settings import get_settings
from polyspec.fleet.from_plan import checked_plan
from polyspec.k8s.settings import load_values, settings_table as table
from polyspec.k8s.sources import (
    check_out, notes, render, targets_from_plan, targets_from_registry, targets_from_shipped, write,
)
from polyspec.registry import open_registry
from polyspec.registry.cli_plan import app as deploy


def k8s(
    out: Optional[Path] = typer.Option(None, "--out", help="Directory to write the manifests into (created)."),
    example: bool = typer.Option(False, "--example", help="Render the shipped drafts (models/drafts) with the "
                                 "default values, without a registry, as `helm template` does."),
    values: Optional[Path] = typer.Option(None, "--values", "-f", help="YAML file overriding the settings "
                                          "(`--show-values` prints the defaults)."),
    registry: Optional[str] = typer.Option(None, "--registry", help="Registry URL (default: POLYSPEC_REGISTRY_URL)."),
    plan_file: Optional[Path] = typer.Option(None, "--plan", dir_okay=False, help="Render the fleet of a plan "
                                             "(`polyspec deploy plan --engines N --write FILE`): its deployments, "
                                             "each with its replicas; checked against the registry first."),
    postgres: bool = typer.Option(False, "--postgres", help="Trials: also render a Postgres StatefulSet and the "
                                  "registry Secret pointing at it (the values' registry.postgres)."),
    show_values: bool = typer.Option(False, "--show-values", help="Print the settings in force as YAML and exit."),
    settings_table: bool = typer.Option(False, "--settings-table", help="Print the settings as a Markdown table "
                                        "(docs/scale-out.md) and exit."),
) -> None:
    """Render Kubernetes manifests: per deployment a vLLM Deployment + Service whose init containers fetch and
    sha256-check the verifier and draft; the router with HPA, PDB and Service; the registry Secret reference
    (or a trial Postgres); a ServiceMonitor; the dashboard. `kubectl apply -f DIR` applies them; NOTES.txt
    says what else to do. Settings: docs/scale-out.md#kubernetes."""
    if settings_table:
        typer.echo(table(), nl=False)
        return
    settings = load_values(values)
    if postgres:
        settings = settings.model_copy(update={"registry": settings.registry.model_copy(update={"postgres": True})})
    if show_values:
        typer.echo(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False), nl=False)
        return
    if out is None:
        raise InvalidInput("--out DIR is required (the directory the manifests are written into)")
    check_out(out)
    if example and registry:
        raise InvalidInput("--example renders the shipped drafts without a registry; drop --registry or --example")
    plan = None
    if example and plan_file:
        raise InvalidInput("--example renders the shipped drafts, --plan a plan's fleet: give one")
    if example:
        targets = targets_from_shipped()
    elif plan_file is not None:
        with open_registry(registry, create=False) as reg:
            plan = checked_plan(plan_file, reg, memory=False)  # the cluster's memory is not this machine's
            targets = targets_from_plan(reg, plan)
    else:
        # named in the 'no deployments' message: without its password
        where = make_url(registry or get_settings().resolved_registry_url).render_as_string(hide_password=True)
        with open_registry(registry, create=False) as reg:
            targets = targets_from_registry(reg, where)
    paths = write(out, render(targets, settings, plan), notes(targets, settings))
    for path in paths:
        typer.echo(str(path))
    typer.echo(f"{len(targets)} engine deployment(s); apply with `kubectl apply -f {out}`, then read "
               f"{out / 'NOTES.txt'}", err=True)


def register(root: typer.Typer) -> None:
    """Add `k8s` to the `deploy` group (registered by polyspec.registry.cli_plan, which the registry layer
    owns and so cannot import this app-layer module)."""
    deploy.command("k8s")(k8s)
