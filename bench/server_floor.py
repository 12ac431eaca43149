"""Server floor: would another HTTP server lower what every request through the router costs?

bench/router_budget.py finds that uvicorn (httptools, uvloop) alone takes most of what the Python floor costs per
request, as much as vllm-router's whole CPU per request or more. This bench asks whether another well-kept
Python HTTP server would take less. It
runs the floor of bench/python_floor.py (the router's upstream client forwarding to the fake backend, with
nothing on top) under each server, on the same core, over the same fake backend:

- ``uvicorn``       the server `polyspec serve` runs (httptools, uvloop);
- ``granian-asgi``  granian (Rust HTTP; one worker, one runtime thread, uvloop), the same ASGI app;
- ``granian-rsgi``  granian's own interface (RSGI): no ASGI messages, the same upstream client.

Every cell (concurrency, streamed or not) is measured for each server in each of ``--rounds`` rounds, in an
order that rotates per round (`bench.router_ab.measure_rounds`, the A/B loop). Reported per cell: CPU ms per request of each server, and each granian
server's over uvicorn's, the mean of the per-round ratios with a 95 % Student-t interval over rounds
(`bench.router_ab.ratio_interval`, the A/B rule); an interval that crosses 1.0 is no measured difference.

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/server_floor.py
    .venv/bin/python bench/server_floor.py --quick      # smoke run: server_floor_quick.json

Writes docs/benchmarks/server_floor.json; `bench/report.py server_floor.json` prints the table that
docs/benchmarks.md quotes.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import BenchError, concurrency_levels, machine_info, write_json  # noqa: E402
from bench.python_floor import SERVERS  # noqa: E402
from bench.router_ab import measure_rounds, ratio_interval  # noqa: E402
from bench.router_overhead import CLIENT_CPU, ROUTER_CPU, request_bodies  # noqa: E402
from bench.servers import Server, start_backend, start_python_floor  # noqa: E402

console = Console(width=150)
BASE = SERVERS[0]  # uvicorn: what the others are compared with


def run(rounds: int, concs: list[int], requests: int, max_seconds: float) -> list[dict[str, Any]]:
    bodies = request_bodies(20)
    cells = [(c, s) for c in concs for s in (False, True)]
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory(prefix="polyspec-server-floor-") as tmp:
        root = Path(tmp)
        try:
            servers["backend"] = start_backend(root, CLIENT_CPU)
            for arm in SERVERS:
                servers[arm] = start_python_floor(root, servers["backend"].url, ROUTER_CPU, server=arm)
            measured = measure_rounds(servers, SERVERS, cells, rounds, bodies, requests, max_seconds,
                                      "rounds x cells x servers")
        finally:
            for s in servers.values():
                s.stop()
    out = []
    for (conc, stream), by_arm in measured.items():
        cpu = {arm: [m["cpu_ms_per_req"] for m in ms] for arm, ms in by_arm.items()}
        out.append({"concurrency": conc, "stream": stream, "cpu_ms": cpu,
                    "p50_ms": {arm: [m["p50_ms"] for m in ms] for arm, ms in by_arm.items()},
                    "vs_uvicorn": {arm: ratio_interval(cpu[BASE], cpu[arm]) for arm in SERVERS if arm != BASE}})
    return out


def print_cells(cells: list[dict[str, Any]]) -> None:
    table = Table(title="the floor under each HTTP server: router CPU ms per request (median of rounds)")
    for col in ("conc", "stream", *SERVERS, *(f"{a} / {BASE}" for a in SERVERS[1:])):
        table.add_column(col, justify="right")
    for c in cells:
        ratios = [f"{v['ratio_mean']:.3f} ({v['ratio_ci95'][0]:.3f}-{v['ratio_ci95'][1]:.3f})"
                  for v in c["vs_uvicorn"].values()]
        table.add_row(str(c["concurrency"]), "yes" if c["stream"] else "no",
                      *(f"{statistics.median(c['cpu_ms'][a]):.3f}" for a in SERVERS), *ratios)
    console.print(table)


def main(
    rounds: int = typer.Option(6, min=2, help="Rounds (the interval is over rounds)."),
    concurrency: str = typer.Option("1,16,64", help="Comma-separated concurrency levels."),
    requests: int = typer.Option(1500, min=50, help="Count bound of each measurement."),
    max_seconds: float = typer.Option(4.0, min=1.0, help="Time bound of each measurement (seconds)."),
    quick: bool = typer.Option(False, "--quick", help="Smoke run (2 rounds, concurrency 1, 200 requests) to "
                                                       "server_floor_quick.json."),
) -> None:
    """CPU per request of the router's floor under uvicorn and under granian, in rotating rounds."""
    output = "server_floor.json"
    if quick:
        rounds, concurrency, requests, max_seconds, output = 2, "1", 200, 2.0, "server_floor_quick.json"
    try:
        concs = concurrency_levels(concurrency)
    except BenchError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    try:
        cells = run(rounds, concs, requests, max_seconds)
    except BenchError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    print_cells(cells)
    payload = {"benchmark": "server_floor", "servers": list(SERVERS), "base": BASE, "rounds": rounds,
               "requests": requests, "max_seconds": max_seconds, "machine": machine_info(), "cells": cells}
    console.print(f"wrote {write_json(output, payload)}")


if __name__ == "__main__":
    typer.run(main)
