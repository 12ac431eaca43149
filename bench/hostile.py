"""What hostile bodies cost the router → docs/benchmarks/hostile.json.

Two measurements, side by side in one run:

1. **Pre-routing work per body, in process.** For each hostile shape at 40 KB, 1 MB (the default body
   limit) and 4 MB (a raised one): the router's own work before it contacts an engine, which runs on the
   event loop —
   decode (router.edge.body), pins, classification (language ID and domain), re-encoding. Median and
   maximum of ``--repeats`` runs, and milliseconds per MB.
2. **/health under attack, served.** `polyspec serve` in front of the fake backend; /health latency is
   sampled in alternating rounds, idle and while two clients send hostile bodies (up to the 1 MB limit)
   nonstop. The p99 ratio (attack / idle) gets a 95% bootstrap interval over rounds.

    .venv/bin/python bench/hostile.py            # full run (~2 min)
    .venv/bin/python bench/hostile.py --quick    # smoke run
    .venv/bin/python bench/report.py hostile.json
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import track  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import machine_info, t_interval, write_json  # noqa: E402
from bench.servers import make_registry, start_backend, start_polyspec  # noqa: E402

console = Console()
SIZES = {"40KB": 40_000, "1MB": 1_000_000, "4MB": 4_000_000}


def _chat(content: Any, messages: int = 1) -> dict[str, Any]:
    filler = [{"role": "assistant", "content": "a"}] * (messages - 1)
    return {"model": "polyspec", "max_tokens": 1, "messages": filler + [{"role": "user", "content": content}]}


def shapes(size: int) -> dict[str, bytes]:
    """Hostile bodies of about ``size`` bytes (the shapes that once froze the router, and object floods)."""
    n = max(1, size // 2)
    bodies = {
        "newlines + code cues": _chat("def" + "\n" * (n // 2) + "import os\n#include <x>\n@"),
        "e-mail run": _chat("a." * (n // 2) + " @"),
        "plain prose": _chat("Bonjour le monde. " * (size // 18)),
        "many messages": _chat("hi", messages=max(1, size // 40)),
        "many content parts": _chat([{"type": "text", "text": "a"}] * max(1, size // 30)),
        "token-id prompt": {"model": "polyspec", "max_tokens": 1, "prompt": list(range(size // 8))},
    }
    return {name: json.dumps(body).encode() for name, body in bodies.items()}


def prerouting_ms(raw: bytes) -> float:
    """The router's work on one body before any engine is contacted (proxy.prepare without telemetry)."""
    from polyspec.router.edge.body import decode_body, encode_body, field
    from polyspec.router.decision.classify import classify, pop_router_fields

    t0 = time.perf_counter()
    body, strict = decode_body(raw)
    pins = pop_router_fields(body)
    field(body, "model")
    kind = "chat" if "messages" in body else "completions"
    classify(body, kind, {}, pins, {"en", "fr", "de"}, "en", 0.4, 500)
    encode_body(body, strict)
    return (time.perf_counter() - t0) * 1000


def measure_prerouting(repeats: int) -> list[dict[str, Any]]:
    prerouting_ms(json.dumps(_chat("warm up fastText")).encode())
    rows = []
    for label, size in SIZES.items():
        for shape, raw in shapes(size).items():
            times = [prerouting_ms(raw) for _ in range(repeats)]
            rows.append({"shape": shape, "size": label, "bytes": len(raw), "median_ms": statistics.median(times),
                         "max_ms": max(times), "ms_per_mb": statistics.median(times) / (len(raw) / 1e6)})
    return rows


def _probe(client: httpx.Client, url: str, seconds: float) -> list[float]:
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        client.get(url).raise_for_status()
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.005)
    return out


def _p95(values: list[float]) -> float:
    values = sorted(values)
    return values[int(0.95 * (len(values) - 1))]


def _attack(url: str, bodies: list[bytes], seconds: float, probe: httpx.Client, health_url: str) -> list[float]:
    """/health latencies while two clients send ``bodies`` nonstop to ``url``."""
    stop = threading.Event()

    def send(body: bytes) -> None:
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                c.post(url, content=body, headers={"content-type": "application/json"})

    threads = [threading.Thread(target=send, args=(bodies[i % len(bodies)],)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        return _probe(probe, health_url, seconds)
    finally:
        stop.set()
        for t in threads:
            t.join()


def _stats(rounds: list[list[float]]) -> dict[str, float]:
    flat = sorted(x for r in rounds for x in r)
    return {"p50": statistics.median(flat), "p95": _p95(flat), "p99": flat[int(0.99 * (len(flat) - 1))],
            "max": flat[-1], "samples": len(flat)}


def _ratio(num: list[list[float]], den: list[list[float]], q: float = 0.99) -> dict[str, Any]:
    """Mean over rounds of the per-round ratio of the q-quantiles, with a 95 % Student-t interval over rounds."""
    def quant(values: list[float]) -> float:
        values = sorted(values)
        return values[int(q * (len(values) - 1))]

    ratios = [quant(a) / quant(b) for a, b in zip(num, den)]
    mean, low, high = t_interval(ratios)
    return {"quantile": q, "mean": mean, "ci95": [low, high], "interval": "student-t", "per_round": ratios}


def measure_health(rounds: int, seconds: float) -> dict[str, Any]:
    small, large = shapes(SIZES["40KB"]), shapes(SIZES["1MB"])
    hostile = [small["newlines + code cues"], small["e-mail run"], large["many content parts"], large["token-id prompt"]]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        backend = start_backend(work, None)
        registry = make_registry(work, [("fake", backend.url, ["en"], True)])
        router = start_polyspec(work, registry, None)
        samples: dict[str, list[list[float]]] = {"idle": [], "attack": []}
        health = f"{router.url}/health"
        try:
            with httpx.Client(timeout=30) as client:
                for _ in track(range(rounds), description="/health idle vs under attack", console=console):
                    samples["idle"].append(_probe(client, health, seconds))
                    samples["attack"].append(_attack(f"{router.url}/v1/chat/completions", hostile, seconds, client, health))
        finally:
            router.stop()
            backend.stop()
    return {"rounds": rounds, "seconds_per_phase": seconds, "ms": {k: _stats(v) for k, v in samples.items()},
            "attack_over_idle_p99": _ratio(samples["attack"], samples["idle"])}


def main(quick: bool = typer.Option(False, help="Smoke run: few repeats and rounds."),
         repeats: int = typer.Option(7, help="Runs per body for the pre-routing timing."),
         rounds: int = typer.Option(8, help="Idle/attack rounds for /health.")) -> None:
    if quick:
        repeats, rounds = 2, 2
    rows = measure_prerouting(repeats)
    table = Table(title="pre-routing work per hostile body (event loop), ms")
    for col in ("shape", "size", "median", "max", "ms per MB"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["shape"], r["size"], f"{r['median_ms']:.2f}", f"{r['max_ms']:.2f}", f"{r['ms_per_mb']:.2f}")
    console.print(table)
    health = measure_health(rounds, 1.0 if quick else 3.0)
    lat = Table(title="/health latency, ms (idle, and under hostile bodies)")
    for col in ("router", "p50", "p95", "p99", "max", "samples"):
        lat.add_column(col)
    for name, st in health["ms"].items():
        lat.add_row(name, *(f"{st[k]:.2f}" for k in ("p50", "p95", "p99", "max")), str(st["samples"]))
    console.print(lat)
    r = health["attack_over_idle_p99"]
    console.print(f"/health p99 under attack / idle: {r['mean']:.2f} [95% interval {r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]")
    result = {"benchmark": "hostile", "quick": quick, "machine": machine_info(), "prerouting": rows, "health": health}
    console.print(f"wrote {write_json('hostile_quick.json' if quick else 'hostile.json', result)}")


if __name__ == "__main__":
    typer.run(main)
