"""The router layer's commands: `polyspec serve` and `polyspec route explain`. (`up`, which also starts
engines, belongs to the application layer: polyspec/up.py; `langid` to the core layer: core/langid_cli.py.)"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import sys
from dataclasses import asdict
from typing import Any, Optional

import typer
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from polyspec.core.cli import PolyspecTyper
from polyspec.core.errors import InvalidInput
from polyspec.core.settings import get_settings
from polyspec.router.app import create_app
from polyspec.router.edge.body import decode_body
from polyspec.router.config import RouterConfig
from polyspec.router.errors import BadRequest
from polyspec.router.explain import (decide, endpoint_of, load_runtime, parse_headers, probe_replicas, read_limited,
                                     render)
from polyspec.router.edge.server import build_server

route = PolyspecTyper(name="route", help="Inspect routing decisions.", no_args_is_help=True)


def serve(
    host: Optional[str] = typer.Option(None, help="Listen address (default: POLYSPEC_ROUTER_HOST or 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, help="Listen port (default: POLYSPEC_ROUTER_PORT or 8000)."),
    registry: Optional[str] = typer.Option(None, "--registry", help="Registry URL (default: POLYSPEC_REGISTRY_URL)."),
    threshold: Optional[float] = typer.Option(None, help="Langid confidence below which prompts go to the default pool."),
    capture: Optional[bool] = typer.Option(None, "--capture/--no-capture", help="Keep prompts per language (opt-in)."),
    router_id: Optional[str] = typer.Option(None, help="Name of this router in the live stats."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    admin: bool = typer.Option(True, "--admin/--no-admin", help="Serve the dashboard and its API under /admin."),
) -> None:
    """Serve the OpenAI-compatible router in front of the registry's active deployments.

    With the admin exposed (--host beyond loopback, or POLYSPEC_ROUTER_TRUSTED_PROXIES set), it refuses to
    start without POLYSPEC_ADMIN_TOKEN. SIGTERM (or Ctrl-C) drains: /ready answers 503 at once, in-flight requests may finish within
    POLYSPEC_ROUTER_DRAIN_GRACE_S, and streams still open then end with an error event (router.edge.server).
    """
    overrides: dict[str, Any] = {"host": host, "port": port, "registry_url": registry, "language_threshold": threshold,
                 "capture": capture, "router_id": router_id}
    try:
        config = RouterConfig(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        typer.echo(f"error: invalid router setting: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}", err=True)
        raise typer.Exit(2) from None
    app = create_app(config, mount_admin=admin)
    try:
        server = build_server(app, config, log_level=log_level)
    except InvalidInput as exc:  # an admin that would be exposed without a token
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"polyspec router {config.router_id} on http://{config.host}:{config.port}", err=True)
    # A crash in native code (a segfault in a C library) then leaves every thread's Python stack on stderr, the
    # router's log, instead of a silent exit.
    faulthandler.enable(all_threads=True)
    server.run()


def _config(registry: str | None, threshold: float | None, probe_timeout: float | None) -> RouterConfig:
    overrides: dict[str, Any] = {"registry_url": registry, "language_threshold": threshold, "health_timeout_s": probe_timeout}
    # One probe decides (fail_threshold=1): the router itself waits for fail_threshold failures in a row.
    return RouterConfig(**{k: v for k, v in overrides.items() if v is not None}, fail_threshold=1, capture=False)


def _shown_url(config: RouterConfig) -> str:
    url = config.registry_url or get_settings().resolved_registry_url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - opening it already failed with a clear error, or will
        return url


@route.command("explain")
def explain(
    header: list[str] = typer.Option([], "--header", "-H", help="A request header, NAME:VALUE (repeatable)."),
    endpoint: Optional[str] = typer.Option(
        None, "--endpoint", help="chat or completions (default: completions for a body with 'prompt' and no "
        "'messages', else chat)."),
    registry: Optional[str] = typer.Option(None, "--registry", help="Registry URL (default: POLYSPEC_REGISTRY_URL)."),
    threshold: Optional[float] = typer.Option(None, help="Langid confidence below which prompts go to the default pool."),
    probe: bool = typer.Option(False, "--probe", help="Probe each replica's /health (and /v1/models) once."),
    probe_timeout: Optional[float] = typer.Option(None, help="Seconds per probe (default: health_timeout_s)."),
    as_json: bool = typer.Option(False, "--json", help="Print the decision as JSON."),
) -> None:
    """Explain how the router would route the OpenAI request body read on stdin.

    Prints the language, domain, candidate pools with their MAL figures, the chosen replica and the reason.
    Reads the registry, never writes it, and never creates one.
    """
    config = _config(registry, threshold, probe_timeout)
    headers = parse_headers(header)

    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    if stdin.isatty():
        raise InvalidInput("no request body: pipe an OpenAI request body (JSON) into standard input")
    raw = read_limited(stdin, config.max_body_bytes)
    try:
        body, _ = decode_body(raw)  # before the registry is read: bad input fails fast
        kind = endpoint_of(body, endpoint)
        rt = load_runtime(config)
        if probe:
            asyncio.run(probe_replicas(rt))
        result = decide(rt, raw, headers, kind, probe)
    except BadRequest as exc:  # what the router answers 400 to: a clear line and exit 2
        raise InvalidInput(f"the router would answer 400: {exc.message}") from None
    result.registry = _shown_url(config)
    if as_json:
        typer.echo(json.dumps(asdict(result), indent=2, ensure_ascii=False))
    else:
        render(result)


def register(root: typer.Typer) -> None:
    """Mount this package's commands on the root CLI."""
    root.command("serve")(serve)
    root.add_typer(route, name="route")
