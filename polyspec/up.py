"""`polyspec up`: start one vLLM engine per active deployment (or per fleet YAML entry, or per engine of a fleet
plan: polyspec/fleet/from_plan.py), then the router. A registry with no active deployment gets the plan for the
engines free memory holds.

It lives in the application layer because it joins both sides: engines (polyspec.models) and the router
(polyspec.router), which must never import the models layer itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from polyspec.adapt.cli import AdaptLoop, parse_every
from polyspec.core.settings import get_settings
from polyspec.fleet.from_plan import AUTO, plan_up_from_file
from polyspec.fleet.plan import FleetError, plan_up
from polyspec.fleet.run import run_up
from polyspec.registry import open_registry


def up(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="Fleet YAML (verifier, engines, router); "
                                          "default: the registry's active deployments.", dir_okay=False),
    plan_file: Optional[Path] = typer.Option(None, "--plan", help="A plan (`polyspec deploy plan --engines N "
                                             "--write FILE`): serve exactly its fleet; checked against the registry "
                                             "and the memory available before anything starts. 'auto': plan for "
                                             "the engines free memory holds (the default when the registry has no "
                                             "active deployment).", dir_okay=False),
    host: Optional[str] = typer.Option(None, help="Router listen address (default 127.0.0.1 or the YAML's)."),
    port: Optional[int] = typer.Option(None, help="Router port (default 8000 or the YAML's)."),
    registry: Optional[str] = typer.Option(None, "--registry", help="Registry URL (default: POLYSPEC_REGISTRY_URL)."),
    base_port: int = typer.Option(8101, help="First port for launched engines without one."),
    ready_timeout: float = typer.Option(900.0, help="Seconds to wait for each engine's health."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
    calibrate: bool = typer.Option(False, "--calibrate", help="Calibrate the launched engines for the speed policy "
                                   "(`polyspec engines calibrate`, quick: batch 1 and 2) before the router starts."),
    adapt_every: Optional[str] = typer.Option(None, "--adapt-every", help="Also run `polyspec adapt --every "
                                              "DURATION` (30m, 2h, ...) beside the router, stopped with the fleet."),
) -> None:
    """Start one vLLM engine per active deployment (or per --config entry, or per engine of a --plan), then the
    router. Ctrl-C stops all."""
    logs = get_settings().home / "logs"
    loop = AdaptLoop(parse_every(adapt_every), registry, logs / "adapt.log") if adapt_every else None
    try:
        if plan_file is not None and config is not None:
            raise FleetError("--plan and --config each say which engines to run: give one")
        if plan_file is None and config is None:
            with open_registry(registry) as reg:
                plan_file = None if reg.active_deployments() else Path(AUTO)
        if plan_file is not None:
            plan = plan_up_from_file(plan_file, host=host, port=port, registry_url=registry, base_port=base_port)
        else:
            plan = plan_up(config, host=host, port=port, registry_url=registry, base_port=base_port)
        run_up(plan, logs_dir=logs, ready_timeout=ready_timeout, log_level=log_level, calibrate=calibrate,
               on_ready=loop.start if loop else None)
    except KeyboardInterrupt:
        typer.echo("interrupted; fleet stopped", err=True)
        raise typer.Exit(130) from None
    finally:
        if loop is not None:
            loop.stop()


def register(root: typer.Typer) -> None:
    root.command("up")(up)
