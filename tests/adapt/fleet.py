"""A fleet under traffic for the adaptation tests (and bench/adapt.py, which measures the same loop at full
size): `polyspec up` serving the shipped English draft with capture on, and clients that talk to its router
in Italian and English until stopped, every request's outcome kept."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from polyspec.core.ports import free_port
from polyspec.router.errors import STREAM_INTERRUPTED

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("POLYSPEC_SHARED_DATA", ROOT.parent / "shared" / "data"))

# A stream whose engine died after its first byte cannot move to another engine: the router ends it with an
# error event and [DONE] (router.errors.sse_error). Counted as a failure, named apart from the others.
BROKEN_STREAM = "stream broke mid-way, ended cleanly by the router"


class FleetError(RuntimeError):
    """The fleet cannot start (no prompts in the data pack, a router that never became ready)."""


class Traffic:
    """Clients of the router: chats in the adapted language and English, some streamed, until stopped; every
    request's outcome is kept with its time, so any window (the swap) can be counted afterwards."""

    def __init__(self, base: str, target: list[str], english: list[str], language: str = "it", workers: int = 2,
                 think_s: float = 1.0, max_tokens: int = 24) -> None:
        if not target or not english:  # a worker would die on its first request and leave no traffic at all
            raise ValueError(f"traffic needs prompts in both languages ({len(target)} {language}, {len(english)} en)")
        self.base, self.target, self.english, self.language = base, target, english, language
        self.think_s, self.max_tokens = think_s, max_tokens
        self.failures: list[str] = []
        self.log: list[tuple[float, bool]] = []  # (end time, ok) of every request
        self.backends: dict[str, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(workers)]

    @property
    def requests(self) -> int:
        return len(self.log)

    def between(self, start: float, end: float) -> tuple[int, int]:
        """(requests, failed) that ended in [start, end]."""
        with self._lock:
            inside = [ok for at, ok in self.log if start <= at <= end]
        return len(inside), inside.count(False)

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(400)

    def _run(self, worker: int) -> None:
        i = worker
        try:
            with httpx.Client(timeout=300) as client:
                while not self._stop.is_set():
                    lang, texts = ("en", self.english) if i % 4 == 3 else (self.language, self.target)
                    text = texts[(i // 4 * 3 + i % 4) % len(texts)]
                    self._one(client, lang, text, stream=i % 5 == 0)
                    i += 2
                    self._stop.wait(self.think_s)  # users pause: the host keeps some CPU for training and the gate
        except Exception as exc:  # a client that dies must fail the run, not leave it quietly without traffic
            with self._lock:
                self.failures.append(f"client {worker} stopped: {type(exc).__name__}: {exc}")

    def _one(self, client: httpx.Client, lang: str, text: str, *, stream: bool) -> None:
        body = {"model": "polyspec", "messages": [{"role": "user", "content": text}], "max_tokens": self.max_tokens,
                "temperature": 0, "stream": stream}
        try:
            with client.stream("POST", f"{self.base}/v1/chat/completions", json=body) as resp:
                data = resp.read().decode()
                ok = resp.status_code == 200 and ("[DONE]" in data if stream else "choices" in data)
                ok = ok and '"error"' not in data
                backend = resp.headers.get("x-polyspec-backend", "?")
            problem = None if ok else f"{lang} HTTP {resp.status_code}: {data[:300]}"
            if not ok and stream and resp.status_code == 200 and ended_by_router(data):
                problem = f"{lang} {BROKEN_STREAM} on {resp.headers.get('x-polyspec-backend', '?')}"
        except httpx.HTTPError as exc:
            problem, backend = f"{lang} {type(exc).__name__}: {exc}", "?"
        with self._lock:
            self.log.append((time.time(), problem is None))
            key = f"{lang}:{backend}"
            self.backends[key] = self.backends.get(key, 0) + 1
            if problem:
                self.failures.append(problem)


def ended_by_router(sse: str) -> bool:
    """True for a stream the router ended as `router.errors.sse_error` does: its last two events are an error
    with code ``stream_interrupted`` and ``[DONE]``. Read as events and JSON, not as text, so the router's
    JSON spacing does not matter."""
    events = [line[5:].strip() for line in sse.splitlines() if line.startswith("data:")]
    if len(events) < 2 or events[-1] != "[DONE]":
        return False
    try:
        error = json.loads(events[-2])["error"]
        return error["code"] == STREAM_INTERRUPTED
    except (ValueError, TypeError, KeyError):
        return False


def prompts(language: str, limit: int = 400) -> tuple[list[str], list[str]]:
    """(language prompts, English prompts) from the shared data pack's `train/more` and `train` files."""
    path = DATA / "train" / "more" / f"{language}.jsonl.gz"
    if not path.is_file():
        path = DATA / "train" / f"{language}.jsonl"
    if not path.is_file():
        raise FleetError(f"no prompts for {language} in {DATA / 'train'}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        target = [r["prompt"] for r in map(json.loads, fh) if r.get("domain", "general") == "general"]
    english = [json.loads(line)["prompt"] for line in (DATA / "train" / "en.jsonl").read_text().splitlines()]
    return [p for p in target if len(p) > 25][:limit], [p for p in english if len(p) < 400][:100]


def _wait_ready(url: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FleetError(f"polyspec up exited with code {proc.returncode} before {url} answered")
        try:
            resp = httpx.get(url, timeout=2.0)
            if resp.status_code < 300:
                return
            last = f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.25)
    raise FleetError(f"{url} not ready after {timeout:.0f}s ({last})")


def start_fleet(verifier: Any, root: Path, env_extra: dict[str, str]) -> tuple[subprocess.Popen, str, str, dict]:
    """A registry with the shipped English draft (and its evaluations) as the only, default deployment, then
    `polyspec up` with capture on and the MAL policy; returns (process, router base URL, registry URL, the
    environment, for `polyspec adapt` to run with). The MAL policy, set here since the speed policy became the
    default: a swapped-in draft then serves its language because it is that language's own pool, which is
    what the adaptation bench and tests/adapt/test_e2e.py measure. Under the speed policy a CPU-sized
    candidate that accepts less than the English draft would rightly lose Italian to it (docs/speed.md)."""
    from polyspec.models.shipped import shipped_for_language
    from polyspec.registry import open_registry

    url = f"sqlite:///{root / 'registry.db'}"
    shipped = shipped_for_language(verifier.name, "en", specialist=True)
    with open_registry(url) as reg:
        reg.add_verifier(verifier)
        rec = reg.import_draft(shipped.path, verifier=verifier.name, name="en-base", languages=["en"], status="active")
        for row in shipped.evaluations:  # Italian among them: the router then labels Italian as itself
            reg.add_evaluation(rec.ref, **row)
        reg.deploy(rec.ref, name="en-engine", default=True, launch={
            "port": free_port(), "cpu_bind": "nobind", "threads": 1, "kv_cache_gib": 1, "max_model_len": 1024})
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "POLYSPEC_REGISTRY_URL": url, "POLYSPEC_HOME": str(root / "home"), "POLYSPEC_ADMIN_TOKEN": "",
           "POLYSPEC_ROUTER_CAPTURE": "1", "POLYSPEC_ROUTER_CAPTURE_DIR": str(root / "capture"),
           "POLYSPEC_ROUTER_FLUSH_INTERVAL_S": "1", "POLYSPEC_ROUTER_REFRESH_INTERVAL_S": "5",
           "POLYSPEC_ROUTER_READ_TIMEOUT_S": "300", "POLYSPEC_ROUTER_POLICY": "mal",
           "POLYSPEC_ADAPT_ROUTER_URLS": json.dumps([base]), **env_extra}
    proc = subprocess.Popen([sys.executable, "-m", "polyspec.cli", "up", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=open(root / "up.log", "wb"))
    try:
        _wait_ready(f"{base}/ready", 900, proc)
    except BaseException:
        stop_fleet(proc, url)
        raise
    return proc, base, url, env


def stop_fleet(proc: subprocess.Popen, registry_url: str) -> None:
    from polyspec.adapt.engines import ENGINE_KEY, stop_pid
    from polyspec.registry import open_registry

    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(180)
    except subprocess.TimeoutExpired:
        proc.kill()
    with open_registry(registry_url) as reg:
        for dep in reg.deployments(include_stopped=True):
            engine = (dep.launch or {}).get(ENGINE_KEY) or {}
            stop_pid(engine.get("pid"), engine.get("port"))
