"""Shared helpers of the benchmark scripts: data loading, the peer venv, ports, atomic JSON output.

MT-Bench turns come from the copy bundled with the package (``training/data/mtbench``); training prompts
from the shared data pack (``../shared/data``), which benchmarks may read and the product never does.
Peers (lingua, py3langid, LiteLLM, vllm-router) live in a separate venv, ``.venv-bench``
(see ``bench/setup_peers.sh``), so they can never change the product's pinned packages.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from polyspec.core.atomic import atomic_write_json

# Fewer prompts than this get no bootstrap interval: resampling one or two prompts gives an interval of (nearly)
# zero width, which reads as certainty (a --quick run has one prompt per language).
MIN_INTERVAL_PROMPTS = 3


def interval_text(ci: list[float] | None, prompts: int, digits: int = 3) -> str:
    """``low–high``, or why there is none."""
    return f"{ci[0]:.{digits}f}–{ci[1]:.{digits}f}" if ci else f"none ({prompts} prompts)"


ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("POLYSPEC_SHARED_DATA", ROOT.parent / "shared" / "data"))
MTBENCH = ROOT / "training" / "data" / "mtbench"  # bundled; identical to the data pack's eval/mtbench
OUT_DIR = ROOT / "docs" / "benchmarks"
BENCH_VENV = ROOT / ".venv-bench"
BENCH_PY = BENCH_VENV / "bin" / "python"

TRAIN_LANGS = ["en", "fr", "de", "es", "it", "pt", "ru", "zh", "ja", "ar", "hi", "th"]
MTBENCH_LANGS = ["en", "de", "es", "fr", "it", "ja", "zh", "ru", "ko"]


class BenchError(RuntimeError):
    """A benchmark cannot run (missing data, missing peer venv, a server that never came up)."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise BenchError(f"data file not found: {path} (set POLYSPEC_SHARED_DATA to the shared data pack)")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def train_prompts(lang: str, limit: int, seed: int = 0) -> list[str]:
    """Up to ``limit`` training prompts of one language, a seeded sample across all its sources."""
    rows = read_jsonl(DATA / "train" / f"{lang}.jsonl")
    rng = random.Random(f"{seed}-{lang}")
    rng.shuffle(rows)
    return [r["prompt"] for r in rows[:limit]]


def mtbench_turns(lang: str, limit: int | None = None, turn: int | None = None) -> list[str]:
    """MT-Bench user turns of one language (both turns unless ``turn`` is 0 or 1), in file order."""
    rows = read_jsonl(MTBENCH / f"{lang}.jsonl")
    turns = [t for r in rows for i, t in enumerate(r["turns"]) if turn is None or i == turn]
    return turns[:limit] if limit is not None else turns


# Two-sided 95 % quantiles of Student's t by degrees of freedom 1..30; past 30, the normal's 1.96.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean of per-round values and its 95 % Student-t interval.

    The benches that repeat a measurement in rounds (router_ab, hostile) use this, not a percentile bootstrap:
    over 5-8 rounds a bootstrap is too narrow (it ignores that the spread is itself estimated from so few
    values), and an A/A run of the router's code against itself got a false verdict from it in one cell of four
    (docs/benchmarks/router_ab/aa-null.json)."""
    if len(values) < 2:
        raise ValueError("an interval needs at least two rounds")
    mean = statistics.fmean(values)
    t = T_975[len(values) - 2] if len(values) - 1 <= len(T_975) else 1.96
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def concurrency_levels(text: str) -> list[int]:
    """"1,16,64" -> [1, 16, 64]: a bench's --concurrency, checked before it starts anything (BenchError
    with a message that names the option)."""
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise BenchError(f"--concurrency takes integers separated by commas, not {text!r}") from None
    if not levels or levels[0] < 1:
        raise BenchError("--concurrency needs at least one level, each at least 1")
    return levels


def machine_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "load_avg_1m_at_start": round(load[0], 2),
            "note": "2 cores shared with other jobs; compare ratios within one run, not absolute times"}


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Atomic write of ``docs/benchmarks/<name>`` (temp file, then rename)."""
    target = OUT_DIR / name
    atomic_write_json(target, payload, indent=1)
    return target


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Atomic write of a matplotlib figure (temp file, then rename); closes the figure."""
    import matplotlib.pyplot as plt

    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    tmp.replace(path)
    return path


def tps_bars(ticks: list[str], series: list[tuple[str, str, list[float]]], title: str,
             size: tuple[float, float] = (10, 4), width: float = 0.26) -> tuple[Any, Any]:
    """(figure, axes) of grouped bars of tokens/s, one group per tick and one bar per (label, colour, values)
    series, each bar with its value; the caller adds what else it shows, then ``finish_figure``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    for j, (label, color, values) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(ticks))]
        ax.bar(xs, values, width, label=label, color=color)
        for x, y in zip(xs, values, strict=True):
            ax.text(x, y, f"{y:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(ticks)), ticks)
    ax.set_ylabel("generated tokens/s (one stream)")
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    return fig, ax


def finish_figure(fig: Any, ax: Any, path: Path) -> Path:
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def require_bench_venv(module: str | None = None) -> Path:
    """The peer venv's python; a clear error when it (or ``module`` inside it) is missing."""
    if not BENCH_PY.exists():
        raise BenchError(f"{BENCH_VENV} is missing: run `bash bench/setup_peers.sh` first")
    if module is not None:
        probe = subprocess.run([str(BENCH_PY), "-c", f"import {module}"], capture_output=True, text=True)
        if probe.returncode != 0:
            raise BenchError(f"{module} is not installed in {BENCH_VENV}: run `bash bench/setup_peers.sh`")
    return BENCH_PY


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, headers: dict | None = None) -> None:
    """Poll ``url`` until it answers 2xx; fail fast when ``proc`` died."""
    import httpx

    deadline = time.monotonic() + timeout
    last: str = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"server for {url} exited with code {proc.returncode}")
        try:
            r = httpx.get(url, timeout=2.0, headers=headers)
            if r.status_code < 300:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.25)
    raise BenchError(f"{url} not ready after {timeout:.0f}s ({last})")


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Terminate one process we started (by its pid), then kill it if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def python_here() -> str:
    return sys.executable
