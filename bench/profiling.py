"""Sampling profile of a running router under load (py-spy from .venv-bench), summarised as hotspots."""

from __future__ import annotations

import re
import subprocess
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from bench.common import BENCH_VENV, BenchError

# Inclusive shares by component: a stack counts for every component one of its frames belongs to.
CATEGORIES = {
    "langid total (core/langid.py)": ("core/langid.py",),
    "lingua, short texts (core/langid_short.py)": ("core/langid_short.py",),
    "domain detection (core/domains.py)": ("core/domains.py",),
    "fastText predict": ("fasttext/",),
    "langid text cleaning (regex)": ("clean_for_langid",),
    "router classify (router/decision/classify.py)": ("router/decision/classify.py",),
    "router proxy (router/engine/proxy.py)": ("router/engine/proxy.py",),
    "router ASGI path, SSE relay, bookkeeping (router/edge/asgi.py, router/engine/stream.py, job.py)": (
        "router/edge/asgi.py", "router/engine/stream.py", "router/engine/job.py"),
    "router telemetry (router/telemetry.py)": ("router/telemetry.py",),
    "prometheus_client": ("prometheus_client/",),
    "upstream client (router/engine/engine_http.py; aiohttp, httpx before)": (
        "router/engine/engine_http.py", "router/engine/connections.py", "aiohttp/", "httpx/", "httpcore/"),
    "starlette/fastapi": ("starlette/", "fastapi/"),
    "uvicorn protocol": ("uvicorn/protocols",),
    "json encode/decode": ("json/",),
    "sqlalchemy": ("sqlalchemy/",),
    "anyio": ("anyio/",),
}
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def frame_key(frame: str) -> str:
    """'func (path/to/file.py:123)' -> 'func (file.py tail)': line numbers dropped, paths shortened."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{m.group('func')} ({path})"


def parse_collapsed(text: str) -> dict[str, Any]:
    """Self and inclusive sample counts per function from py-spy's raw (collapsed-stack) output."""
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    cat_c: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_key(f) for f in stack.split(";") if f]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        self_c[frames[-1]] += n
        for f in set(frames):
            incl_c[f] += n
        for cat, markers in CATEGORIES.items():
            if any(m in f for f in frames for m in markers):
                cat_c[cat] += n
    def top(c: Counter[str], k: int) -> list[dict[str, Any]]:
        return [{"function": f, "samples": n, "share": round(n / total, 4)} for f, n in c.most_common(k)]

    ours = Counter({f: n for f, n in incl_c.items() if f.split(" (")[-1].startswith(("router/", "core/", "models/"))})
    return {"samples": total, "self": top(self_c, 20), "inclusive_ours": top(ours, 20),
            "components": top(cat_c, len(CATEGORIES))}


def profile_under_load(server: Any, bodies: list[dict], run_loadgen: Callable[..., dict], client_cpu: str,
                       seconds: float = 15, concurrency: int = 64) -> dict[str, Any]:
    """Record ``server`` with py-spy while streamed and non-streamed requests run at ``concurrency``."""
    spy = BENCH_VENV / "bin" / "py-spy"
    if not spy.exists():
        raise BenchError("py-spy is missing from .venv-bench: run `bash bench/setup_peers.sh`")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.txt"
        cmd = ["taskset", "-c", client_cpu, str(spy), "record", "--pid", str(server.pid), "--duration",
               str(int(seconds)), "--rate", "200", "--format", "raw", "--output", str(out), "--nonblocking"]
        spy_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        results: dict[str, Any] = {}

        def load(stream: bool) -> None:
            spec = {"url": f"{server.url}/v1/chat/completions", "bodies": [{**b, "stream": stream} for b in bodies],
                    "concurrency": concurrency // 2, "requests": 100_000, "max_seconds": seconds, "stream": stream,
                    "warmup": 0, "headers": server.headers, "timeout_s": 60}
            results["stream" if stream else "non_stream"] = run_loadgen(spec, timeout=seconds + 120)

        threads = [threading.Thread(target=load, args=(s,)) for s in (False, True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _, err = spy_proc.communicate(timeout=seconds + 60)
        if spy_proc.returncode != 0 or not out.exists():
            raise BenchError(f"py-spy failed: {err.strip()[-500:]}")
        parsed = parse_collapsed(out.read_text())
    parsed["load"] = {k: {"rps": v["rps"], "requests": v["requests"], "errors": v["errors"]} for k, v in results.items()}
    parsed["tool"] = "py-spy 0.4.3 record --rate 200 --nonblocking"
    parsed["concurrency"] = concurrency
    return parsed


def print_hotspots(prof: dict[str, Any], console: Any, k: int = 15) -> None:
    from rich.table import Table

    titles = {"components": "share of samples per component (inclusive)", "self": "top functions by self time",
              "inclusive_ours": "router/, core/ and models/ functions by inclusive time"}
    for kind, title in titles.items():
        table = Table(title=f"polyspec under load: {title} ({prof['samples']} samples)")
        table.add_column("share", justify="right")
        table.add_column("function", overflow="fold")
        for row in prof[kind][:k]:
            table.add_row(f"{100 * row['share']:.1f}%", row["function"])
        console.print(table)
