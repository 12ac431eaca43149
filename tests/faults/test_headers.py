"""Header size: request heads beyond ``max_header_bytes`` get 431 and cost bounded
memory; the router stays up. The server is the one `polyspec serve` runs (router.edge.server.build_server),
on a real socket: uvicorn with httptools took a 16 MB header whole before.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import httpx
import pytest

from tests.faults.conftest import router_config
from polyspec.core.ports import free_port

LIMIT = 32 * 1024


@contextmanager
def served(registry_url: str, **overrides: Any) -> Iterator[Any]:
    from polyspec.router.app import create_app
    from polyspec.router.edge.server import build_server

    config = router_config(registry_url, port=free_port(), **overrides)
    app = create_app(config, mount_admin=False)
    server = build_server(app, config, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "router did not start"
        time.sleep(0.02)
    server.url = f"http://127.0.0.1:{config.port}"
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(15)


def _raw(url: str, pieces: list[bytes], pause: float = 0.0) -> bytes:
    """Send a request in pieces on a raw socket; what the server answered before closing."""
    host, port = url.removeprefix("http://").split(":")
    with closing(socket.create_connection((host, int(port)), timeout=10)) as sock:
        try:
            for piece in pieces:
                sock.sendall(piece)
                if pause:
                    time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-request: what matters is the answer below
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and (b"content-length: 0" in answer.lower() or answer.endswith(b"}")):
                break
        return answer


def _rejected(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    line = next((x for x in text.splitlines() if x.startswith('polyspec_rejected_requests_total{reason="header_too_large"}')), "")
    return float(line.split()[-1]) if line else 0.0


@pytest.mark.parametrize("shape", ["one-1MB-header", "many-small-headers", "long-url", "dribbled-40KB"])
def test_oversized_request_head_gets_431_and_the_router_stays_up(registry_url, shape):
    with served(registry_url, max_header_bytes=LIMIT) as router:
        if shape == "one-1MB-header":
            answer = httpx.get(f"{router.url}/health", headers={"X-Big": "a" * (1 << 20)}, timeout=10)
            assert answer.status_code == 431
            assert answer.json()["error"]["code"] == "request_header_too_large"
        else:
            if shape == "many-small-headers":
                head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100)
                                                                          for i in range(400)) + b"\r\n"
                pieces = [head]
            elif shape == "long-url":
                pieces = [b"GET /health?" + b"q" * (2 * LIMIT) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"]
            else:  # a slowly growing header, 1 KB at a time: httptools would buffer it all
                pieces = [b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "] + [b"s" * 1024] * 40 + [b"\r\n\r\n"]
            answer = _raw(router.url, pieces, pause=0.002 if shape == "dribbled-40KB" else 0.0)
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
            assert b"request_header_too_large" in answer and b"connection: close" in answer
        assert httpx.get(f"{router.url}/health", timeout=5).status_code == 200
        assert _rejected(router.url) == 1


def test_heads_under_the_limit_and_large_bodies_pass(registry_url):
    with served(registry_url, max_header_bytes=LIMIT) as router:
        near = {f"X-H{i}": "v" * 1000 for i in range(28)}  # ~28.5 KB of headers: under 32 KB
        assert httpx.get(f"{router.url}/health", headers=near).status_code == 200
        # A large body in the same read as its head is body, not head.
        body = b'{"model": "polyspec", "messages": [{"role": "user", "content": "' + b"x" * 200_000 + b'"}]}'
        resp = httpx.post(f"{router.url}/v1/chat/completions", content=body,
                          headers={"content-type": "application/json", **near})
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_healthy_backend"
        # The read that ends a body (and the request) is body too, even when it is larger than the limit.
        content = b'{"model": "polyspec", "messages": [{"role": "user", "content": "' + b"y" * 60_000 + b'"}]}'
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n" % len(content))
        answer = _raw(router.url, [head + content[:100], content[100:]], pause=0.2)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
        # Keep-alive: several requests on one connection, each head counted on its own.
        with httpx.Client() as client:
            for _ in range(5):
                assert client.get(f"{router.url}/health", headers=near).status_code == 200
        assert _rejected(router.url) == 0


@pytest.mark.parametrize("first", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"],
                         ids=["silent-connection", "head-never-ends"])
def test_slow_request_head_is_closed_after_header_timeout(registry, registry_url, first):
    """Slowloris on headers: a connection that sends part of a head (or nothing) and stalls is closed after
    header_timeout_s, counted, and other clients are served meanwhile."""
    with served(registry_url, header_timeout_s=1.0) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with closing(socket.create_connection((host, int(port)), timeout=10)) as sock:
            t0 = time.monotonic()
            if first:
                sock.sendall(first)
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200  # others are served
            assert sock.recv(1024) == b""  # closed by the router, no request ever started
            elapsed = time.monotonic() - t0
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
    assert 0.8 < elapsed < 5, elapsed
    assert 'polyspec_rejected_requests_total{reason="header_timeout"} 1.0' in metrics
