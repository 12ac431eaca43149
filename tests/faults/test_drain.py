"""SIGTERM drains. A real `polyspec serve` process in front of a slow
(fake) engine stream: /ready is never 200 again once the signal is in, new connections are refused,
a stream that ends within the grace period completes normally, one still open at the deadline gets an
SSE error event and a clean end of body (never a silent cut), live stats are flushed, and the process
exits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.faults.conftest import wait_for
from tests.router.fakes import BrokenEngine
from polyspec.core.ports import free_port

GRACE_S = 3.0


class _Stream(threading.Thread):
    """One streamed chat read to its end: its SSE data, when the body ended, and how."""

    def __init__(self, url: str, chunks: int) -> None:
        super().__init__(daemon=True)
        self.url, self.chunks = url, chunks
        self.events: list[str] = []
        self.first = threading.Event()
        self.ended_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        body = {"model": "polyspec", "stream": True, "max_tokens": self.chunks,
                "messages": [{"role": "user", "content": "Hello, how are you today?"}]}
        try:
            with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, timeout=30) as resp:
                assert resp.status_code == 200
                for line in resp.iter_lines():  # raises if the body is cut instead of ended
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.first.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        self.ended_at = time.monotonic()


def _ready_status(url: str) -> str:
    try:
        resp = httpx.get(f"{url}/ready", timeout=2)
    except httpx.TransportError:
        return "refused"
    return f"{resp.status_code} {resp.json().get('reason')}"


def test_sigterm_drains_streams_then_ends_the_rest_with_an_error_event(registry, registry_url, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "router.log"
    env = {**os.environ, "POLYSPEC_ROUTER_DRAIN_GRACE_S": str(GRACE_S), "POLYSPEC_ROUTER_FLUSH_INTERVAL_S": "3600"}
    with BrokenEngine("slow", slow_interval_s=0.1) as fake, BrokenEngine("hang") as hung, open(log, "w") as out:
        registry.deploy(None, name="slowpoke", url=fake.url, languages=["en"], default=True)
        registry.deploy(None, name="hung", url=hung.url, languages=["fr"])
        proc = subprocess.Popen([Path(sys.executable).parent / "polyspec", "serve", "--port", str(port),
                                 "--registry", registry_url, "--log-level", "info"], stdout=out, stderr=out, env=env)
        try:
            assert wait_for(lambda: _ready_status(url).startswith("200"), 120), log.read_text()[-2000:]
            short, long = _Stream(url, 15), _Stream(url, 100_000)  # 1.5 s of chunks; then "forever"
            short.start()
            long.start()
            unary: dict[str, httpx.Response] = {}  # waits for an engine that never answers
            waiting = threading.Thread(target=lambda: unary.setdefault("resp", httpx.post(
                f"{url}/v1/chat/completions", headers={"X-Polyspec-Language": "fr"}, timeout=30,
                json={"model": "polyspec", "messages": [{"role": "user", "content": "Bonjour"}]})), daemon=True)
            waiting.start()
            assert short.first.wait(10) and long.first.wait(10)
            assert wait_for(lambda: hung.completion_requests == 1, 10)
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            seen: list[str] = []

            def refused() -> bool:
                seen.append(_ready_status(url))
                return seen[-1] == "refused"

            assert wait_for(refused, 5, 0.005), seen  # the listener closes: no new connection
            assert all(s == "refused" or s.startswith("503 draining") for s in seen), seen  # never 200

            short.join(10)
            assert short.error is None and short.events[-1] == "[DONE]", (short.error, short.events[-3:])
            assert len(short.events) == 16 and not any('"error"' in e for e in short.events)
            assert short.ended_at - sent < GRACE_S

            long.join(GRACE_S + 10)
            assert long.error is None, long.error  # the body ended; it was not cut
            assert GRACE_S - 0.5 < long.ended_at - sent < GRACE_S + 2
            error = json.loads(long.events[-2])["error"]
            assert error["code"] == "router_shutdown" and error["type"] == "service_unavailable"
            assert long.events[-1] == "[DONE]" and len(long.events) > 20
            waiting.join(10)  # a request with no answer yet at the deadline: an OpenAI-style 503, not a 500
            assert unary["resp"].status_code == 503, unary["resp"].text
            assert unary["resp"].json()["error"]["code"] == "router_shutdown"
            assert proc.wait(15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it is done
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    text = log.read_text()
    assert "draining: /ready now answers 503" in text
    assert f"drain grace of {GRACE_S:g} s over: ending 2 open request(s) with an error" in text
    from polyspec.registry import open_registry

    with open_registry(registry_url) as reg:  # flushed at shutdown (the periodic flush is an hour away)
        assert sum(s.requests for s in reg.live_stats()) == 1  # the stream that completed


def test_sigterm_turns_ready_off_at_once(registry_url):
    """The signal handler itself flips readiness: nothing waits for uvicorn's next tick."""
    from polyspec.router.app import create_app
    from polyspec.router.edge.server import build_server
    from tests.faults.conftest import router_config

    config = router_config(registry_url)
    app = create_app(config, mount_admin=False)
    server = build_server(app, config)
    rt = app.state.runtime
    assert rt.readiness()["reason"] != "draining: the router is shutting down"
    server.handle_exit(signal.SIGTERM, None)
    body = rt.readiness()
    assert body["ready"] is False and body["reason"] == "draining: the router is shutting down"
    assert body["draining"] is True and server.should_exit


def test_a_router_that_crashes_in_native_code_leaves_every_thread_s_stack_in_its_log(registry, registry_url, tmp_path):
    """A segfault in a C library (a router of the fleet bench once died so, in libsqlite3, and said nothing) writes
    the Python stack of each thread to the router's stderr before the process dies."""
    port = free_port()
    log = tmp_path / "router.log"
    with BrokenEngine("slow", slow_interval_s=0.1) as fake, open(log, "w") as out:
        registry.deploy(None, name="plain", url=fake.url, languages=["en"], default=True)
        proc = subprocess.Popen([Path(sys.executable).parent / "polyspec", "serve", "--port", str(port),
                                 "--registry", registry_url], stdout=out, stderr=out)
        try:
            assert wait_for(lambda: _ready_status(f"http://127.0.0.1:{port}").startswith("200"), 120), \
                log.read_text()[-2000:]
            proc.send_signal(signal.SIGSEGV)
            assert proc.wait(15) == -signal.SIGSEGV
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert "Fatal Python error: Segmentation fault" in text, text[-2000:]
    assert "Current thread 0x" in text and 'File "' in text, text[-2000:]  # a thread's Python frames
