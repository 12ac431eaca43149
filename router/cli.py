"""`polyspec` commands contributed by the router package: `serve` and `langid`. (`up`, which also starts
engines, belongs to the application layer: polyspec/up.py.)"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from typing import BinaryIO, Optional

import typer


def serve(
    host: Optional[str] = typer.Option(None, help="Listen address (default: POLYSPEC_ROUTER_HOST or 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, help="Listen port (default: POLYSPEC_ROUTER_PORT or 8000)."),
    registry: Optional[str] = typer.Option(None, "--registry", help="Registry URL (default: POLYSPEC_REGISTRY_URL)."),
    threshold: Optional[float] = typer.Option(None, help="Langid confidence below which prompts go to the default pool."),
    capture: Optional[bool] = typer.Option(None, "--capture/--no-capture", help="Keep prompts per language (opt-in)."),
    router_id: Optional[str] = typer.Option(None, help="Name of this router in the live stats."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
) -> None:
    """Serve the OpenAI-compatible router in front of the registry's active deployments.

    SIGTERM (or Ctrl-C) drains: /ready answers 503 at once, in-flight requests may finish within
    POLYSPEC_ROUTER_DRAIN_GRACE_S, and streams still open then end with an error event (router.server).
    """
    from pydantic import ValidationError

    from polyspec.router.app import create_app
    from polyspec.router.config import RouterConfig
    from polyspec.router.server import build_server

    overrides = {"host": host, "port": port, "registry_url": registry, "language_threshold": threshold,
                 "capture": capture, "router_id": router_id}
    try:
        config = RouterConfig(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        typer.echo(f"error: invalid router setting: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}", err=True)
        raise typer.Exit(2) from None
    app = create_app(config)
    typer.echo(f"polyspec router {config.router_id} on http://{config.host}:{config.port}", err=True)
    build_server(app, config, log_level=log_level).run()


MAX_LINE_BYTES = 1 << 20  # a line past this is read to its end but only its first MiB is identified


def _lines(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Lines of ``stream`` without their line ends, each at most ``limit`` bytes (the rest of a longer line is
    read and dropped, so one endless line cannot exhaust memory), decoded as UTF-8 with bad bytes replaced."""
    while line := stream.readline(limit):
        if len(line) == limit and not line.endswith(b"\n"):
            while (rest := stream.readline(limit)) and not rest.endswith(b"\n"):
                pass
        yield line.rstrip(b"\r\n").decode("utf-8", errors="replace")


def langid(
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line, as each line is identified: "
                                 "{text, language, confidence}."),
    restrict: Optional[str] = typer.Option(None, help="Comma-separated labels to choose from, e.g. fr,en,de."),
    workers: int = typer.Option(1, min=1, max=64, help="Processes that identify lines (for large inputs: "
                                "language ID is CPU-bound, so each core needs its own process)."),
) -> None:
    """Identify the language of each line of standard input (fastText lid.176, with word frequencies and lingua
    on short lines; offline). Without --restrict, the first short line loads their models (a few seconds).

    Lines are read and answered as a stream (with --json), in input order, so input of any length runs in
    bounded memory; a line longer than 1 MiB is identified by its first MiB."""
    from polyspec.core.langid_batch import detect_stream

    labels = [x.strip() for x in restrict.split(",") if x.strip()] if restrict else None
    if restrict is not None and not labels:
        typer.echo("error: --restrict needs at least one language code", err=True)
        raise typer.Exit(2)
    if as_json:
        lines, copy = itertools.tee(_lines(sys.stdin.buffer))
        for text, guess in zip(copy, detect_stream(lines, labels, workers)):
            sys.stdout.write(json.dumps({"text": text, "language": guess.language,
                                         "confidence": round(guess.confidence, 6)}, ensure_ascii=False) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Language identification (fastText lid.176 + word frequencies + lingua)")
    table.add_column("text", overflow="fold")
    table.add_column("language")
    table.add_column("confidence", justify="right")
    lines, copy = itertools.tee(_lines(sys.stdin.buffer))
    for text, guess in zip(copy, detect_stream(lines, labels, workers)):
        table.add_row(text[:80] + ("…" if len(text) > 80 else ""), guess.language, f"{guess.confidence:.3f}")
    Console().print(table)


def register(root: typer.Typer) -> None:
    """Mount this package's commands on the root CLI."""
    root.command("serve")(serve)
    root.command("langid")(langid)
