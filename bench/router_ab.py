"""Router A/B: the CPU per request of two polyspec routers, side by side, in alternating rounds.

bench/router_overhead.py measures each cell once, and on a shared 2-core machine one measurement moves by
5-10 % between runs: a change worth a few per cent of the router's CPU drowns in it. This bench starts
polyspec twice on the same core, over the same registry and the same fake backend: the baseline (the
package at git ``--base``) and the candidate (the working tree, another git ref, or a prepared tree on
PYTHONPATH such as a compiled build). It measures both at each cell (concurrency, streamed or not), in
alternating order, ``--rounds`` times, and reports per cell the candidate's CPU per request over the
baseline's: the mean of the per-round ratios with a 95 % Student-t interval over rounds. An interval
that crosses 1.0 is no measured difference. `--label aa-null` style runs of the same code on both sides
check the rule itself: none of its cells may give a verdict.

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/router_ab.py --base HEAD --label my-change
    ... --candidate stash@{0}              # a git ref instead of the working tree
    ... --candidate-path /tmp/tree         # a tree laid out as polyspec/... for PYTHONPATH
    .venv/bin/python bench/report.py router_ab                # the table of every recorded run

Writes docs/benchmarks/router_ab/LABEL.json.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import OUT_DIR, BenchError, concurrency_levels, machine_info, t_interval, write_json  # noqa: E402
from bench.router_overhead import CLIENT_CPU, PACKAGES, ROUTER_CPU, baseline_tree, measure, request_bodies  # noqa: E402
from bench.servers import SERVED_LANGUAGES, Server, make_registry, start_backend, start_polyspec  # noqa: E402

console = Console(width=150)
ARMS = ("base", "candidate")


def ratio_interval(base: list[float], cand: list[float]) -> dict[str, Any]:
    """Mean of the per-round ratios cand/base and its 95 % Student-t interval over rounds (paired;
    `bench.common.t_interval` says why not a bootstrap)."""
    ratios = [c / b for b, c in zip(base, cand, strict=True) if b > 0]
    mean, low, high = t_interval(ratios)  # ValueError under two rounds with a baseline CPU above zero
    verdict = "no difference" if low <= 1.0 <= high else ("candidate cheaper" if high < 1.0 else "candidate dearer")
    return {"ratio_mean": round(mean, 4), "ratio_ci95": [round(low, 4), round(high, 4)],
            "ratios": [round(r, 4) for r in ratios], "interval": "student-t", "verdict": verdict}


def rotation(arms: tuple[str, ...], r: int) -> list[str]:
    """The order of round ``r``: each arm takes each slot once every len(arms) rounds (two arms alternate)."""
    k = r % len(arms)
    return [*arms[k:], *arms[:k]]


Cell = tuple[int, bool]  # (concurrency, streamed)


def measure_rounds(servers: dict[str, Server], arms: tuple[str, ...], cells: list[Cell], rounds: int,
                   bodies: list[dict[str, Any]], requests: int, max_seconds: float, label: str
                   ) -> dict[Cell, dict[str, list[dict[str, Any]]]]:
    """Every arm at every cell in every round, in the order ``rotation`` gives: the measurements per cell
    and arm, in round order. An arm that answers any error stops the run (BenchError)."""
    out: dict[Cell, dict[str, list[dict[str, Any]]]] = {cell: {a: [] for a in arms} for cell in cells}
    with Progress(console=console) as progress:
        task = progress.add_task(label, total=rounds * len(cells) * len(arms))
        for r in range(rounds):
            for conc, stream in cells:
                for arm in rotation(arms, r):
                    s = servers[arm]
                    m = measure(s, s.url, s.headers, bodies, conc, stream, requests, max_seconds)
                    if m["errors"]:
                        raise BenchError(f"{arm} answered {m['errors']} errors: {m['error_kinds']}")
                    out[(conc, stream)][arm].append(m)
                    progress.advance(task)
    return out


def _commit(ref: str) -> str:
    """``ref`` as a short commit hash (HEAD or stash@{0} mean nothing once the run is recorded)."""
    out = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", "--short", ref],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else ref


def _start(workdir: Path, registry: str, pythonpath: Path | None) -> Server:
    env = {"POLYSPEC_ROUTER_POLICY": "speed", **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    return start_polyspec(workdir, registry, ROUTER_CPU, extra_env=env)


def run(base: str, candidate: str, candidate_path: Path | None, folders: set[str], rounds: int,
        concs: list[int], requests: int, max_seconds: float) -> list[dict[str, Any]]:
    bodies = request_bodies(20)
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory(prefix="polyspec-ab-") as tmp:
        root = Path(tmp)
        try:
            servers["backend"] = start_backend(root, CLIENT_CPU)
            registry = make_registry(root, [("bench", servers["backend"].url, SERVED_LANGUAGES, True)])
            (root / "base").mkdir()
            servers["base"] = _start(root / "base", registry, baseline_tree(root / "base", base, folders))
            if candidate_path is None and candidate:
                (root / "cand").mkdir()
                candidate_path = baseline_tree(root / "cand", candidate, folders)
            servers["candidate"] = _start(root, registry, candidate_path)
            cells = [(c, s) for c in concs for s in (False, True)]
            measured = measure_rounds(servers, ARMS, cells, rounds, bodies, requests, max_seconds,
                                      "rounds x cells x arms")
        finally:
            for s in servers.values():
                s.stop()
    cpu = {cell: {arm: [m["cpu_ms_per_req"] for m in ms] for arm, ms in by_arm.items()} for cell, by_arm in measured.items()}
    return [{"concurrency": conc, "stream": stream, "base_cpu_ms": d["base"], "candidate_cpu_ms": d["candidate"],
             **ratio_interval(d["base"], d["candidate"])} for (conc, stream), d in sorted(cpu.items())]


def print_cells(cells: list[dict[str, Any]]) -> None:
    table = Table(title="candidate / baseline, router CPU per request")
    for col in ("conc", "stream", "base ms/req", "candidate ms/req", "ratio", "95 % interval", "verdict"):
        table.add_column(col, justify="left" if col == "verdict" else "right")
    for c in cells:
        table.add_row(str(c["concurrency"]), "yes" if c["stream"] else "no", f"{statistics.median(c['base_cpu_ms']):.3f}",
                      f"{statistics.median(c['candidate_cpu_ms']):.3f}", f"{c['ratio_mean']:.3f}",
                      "{:.3f}-{:.3f}".format(*c["ratio_ci95"]), c["verdict"])
    console.print(table)


def main(
    label: str = typer.Option(..., help="Name of the run: docs/benchmarks/router_ab/LABEL.json."),
    description: str = typer.Option("", help="What the candidate changes (kept in the JSON and the report)."),
    base: str = typer.Option("HEAD", help="Git ref of the baseline."),
    candidate: str = typer.Option("", help="Git ref of the candidate; empty: the working tree."),
    candidate_path: Path = typer.Option(None, help="A prepared tree for PYTHONPATH (polyspec/...) as candidate."),
    folders: str = typer.Option("router,core", help=f"Folders taken from the refs; the rest from the working "
                                                    f"tree. Among: {','.join(PACKAGES.values())}."),
    rounds: int = typer.Option(5, min=2, help="Alternating rounds (the interval is over rounds)."),
    concurrency: str = typer.Option("1,16", help="Comma-separated concurrency levels."),
    requests: int = typer.Option(1500, min=50, help="Count bound of each measurement."),
    max_seconds: float = typer.Option(4.0, min=1.0, help="Time bound of each measurement (seconds)."),
) -> None:
    """CPU per request of a candidate router against a baseline, in alternating rounds, with intervals."""
    chosen = {f.strip() for f in folders.split(",") if f.strip()}
    if not label.replace("-", "").replace("_", "").isalnum() or not chosen <= set(PACKAGES.values()):
        console.print("[red]error:[/] --label takes letters, digits, - and _; --folders names folders of the tree")
        raise typer.Exit(2)
    if candidate and candidate_path:
        console.print("[red]error:[/] give --candidate or --candidate-path, not both")
        raise typer.Exit(2)
    try:
        concs = concurrency_levels(concurrency)
    except BenchError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    try:
        cells = run(base, candidate, candidate_path, chosen, rounds, concs, requests, max_seconds)
    except BenchError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    print_cells(cells)
    what = _commit(candidate) if candidate else (f"tree at {candidate_path}" if candidate_path else "working tree")
    payload = {"benchmark": "router_ab", "label": label, "description": description, "base": _commit(base),
               "candidate": what, "folders": sorted(chosen), "rounds": rounds, "requests": requests,
               "max_seconds": max_seconds, "machine": machine_info(), "cells": cells}
    (OUT_DIR / "router_ab").mkdir(exist_ok=True)
    console.print(f"wrote {write_json(f'router_ab/{label}.json', payload)}")


if __name__ == "__main__":
    typer.run(main)
