"""Faults that come from clients: a slow reader of a stream, and a body far over the size limit.

No real engine: a CPU vLLM streams ~18 tokens/s, far too slow to fill socket buffers, so the slow-reader
case streams from the fake's ``flood`` mode (tests/router/fakes.py); the huge-body case never reaches an
engine. Malformed bodies (invalid UTF-8, broken JSON, wrong shapes) are in test_faults.py.
"""

from __future__ import annotations

import json
import socket
import statistics
import time
from pathlib import Path

import httpx

from tests.router.conftest import chat, openai_error, post_head, read_raw_response, serve_router, wait_for
from tests.router.fakes import FLOOD_BYTES, BrokenEngine

MiB = 1024 * 1024
STREAM_BODY = {"model": "polyspec", "stream": True, "messages": [{"role": "user", "content": "Tell me a long story."}]}


def _raw_request(port: int, head: bytes, body: bytes = b"", rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: no window growth
    sock.connect(("127.0.0.1", port))
    sock.sendall(head + body)
    return sock


def test_huge_body_gets_413_without_being_read(error500, registry_url):
    """A 20 MB JSON body against the default limit (RouterConfig.max_body_bytes, 1 MiB): an OpenAI-style 413
    at once. With a Content-Length the router answers before one body byte is sent; without one (chunked)
    it stops at the limit, so the rest of the body is never needed. The router stays healthy."""
    with serve_router(registry_url, fail_threshold=100) as router:
        limit = router.runtime.config.max_body_bytes
        big = json.dumps({"model": "polyspec", "messages": [{"role": "user", "content": "x" * (20 * MiB)}]}).encode()
        assert limit == MiB and len(big) > 4 * limit

        started = time.perf_counter()
        err = openai_error(httpx.post(f"{router.url}/v1/chat/completions", content=big, timeout=30), 413)
        assert err["code"] == "request_too_large" and err["type"] == "invalid_request_error"
        assert time.perf_counter() - started < 5

        with _raw_request(router.port, post_head("/v1/chat/completions", content_length=len(big))) as sock:
            status, _, body = read_raw_response(sock)  # not one body byte sent
        assert status == 413 and body["error"]["code"] == "request_too_large"

        piece = b"x" * 65536
        chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        with _raw_request(router.port, post_head("/v1/completions", transfer_encoding="chunked"),
                          chunk * (limit // len(piece) + 1)) as sock:  # just over the limit, no final chunk
            status, _, body = read_raw_response(sock)
        assert status == 413 and body["error"]["code"] == "request_too_large"

        assert httpx.get(f"{router.url}/health").status_code == 200
        assert httpx.get(f"{router.url}/ready").status_code == 200
        openai_error(chat(router.url, "Hello there, how are you today?"), 502)  # a normal request still goes through
    assert error500.completion_requests == 1


def _socket_buffer_bound() -> int:
    """Most bytes the kernel may hold for one proxied stream: the router's receive buffer from the engine,
    the engine's and the router's send buffers (the slow client's receive buffer is pinned small)."""
    def most(name: str, default: int) -> int:
        try:
            return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
        except (OSError, IndexError, ValueError):
            return default
    return most("tcp_rmem", 32 * MiB) + 2 * most("tcp_wmem", 4 * MiB)


def _other_requests(url: str) -> list[float]:
    """Latencies of what other clients do meanwhile: a health check, a bad request, the first 256 KB of a
    stream from the same engine (the router relays it, then the client hangs up)."""
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        timings.append(time.perf_counter() - started)
        started = time.perf_counter()
        openai_error(httpx.post(f"{url}/v1/chat/completions", content=b"{", timeout=10), 400)
        timings.append(time.perf_counter() - started)
        started = time.perf_counter()
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=STREAM_BODY, timeout=10) as resp:
            assert resp.status_code == 200
            got = 0
            for part in resp.iter_raw():
                got += len(part)
                if got >= 256 * 1024:
                    break
        timings.append(time.perf_counter() - started)
    return timings


def test_slow_stream_reader_is_back_pressured_and_released(registry, registry_url):
    """A client that stops reading a stream: the router stops reading the engine (bounded by socket buffers,
    not by the stream's 512 MB), other clients are served at their usual latency, and the client's
    disconnect releases the in-flight count and closes the engine connection (vLLM aborts on that)."""
    with BrokenEngine("flood") as fake:
        registry.deploy(None, name="firehose", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url, fail_threshold=100) as router:
            rt = router.runtime
            before = statistics.median(_other_requests(router.url))
            assert wait_for(lambda: rt.backends.in_flight(fake.url) == 0, 10)
            closed = fake.connections_closed_by_peer

            payload = json.dumps(STREAM_BODY).encode()
            slow = _raw_request(router.port, post_head("/v1/chat/completions", content_length=len(payload)),
                                payload, rcvbuf=4096)
            try:
                slow.settimeout(10)
                assert slow.recv(1024).startswith(b"HTTP/1.1 200")  # then it reads nothing more
                stream = len(fake.flood_sent) - 1
                seen: list[int] = []

                def stalled() -> bool:
                    seen.append(fake.flood_sent[stream])
                    return len(seen) > 8 and seen[-1] == seen[-8]  # no growth for ~2 s

                assert wait_for(stalled, 60, step=0.25), seen[-8:]
                taken = fake.flood_sent[stream]
                assert 0 < taken < _socket_buffer_bound() + 16 * MiB < FLOOD_BYTES // 4
                assert rt.backends.in_flight(fake.url) == 1

                during = _other_requests(router.url)
                assert max(during) < 5, during
                assert statistics.median(during) < 3 * before + 0.25, (before, during)
                assert fake.flood_sent[stream] == taken  # the slow stream stayed paused meanwhile
            finally:
                slow.close()  # unread data in its buffer: the kernel resets the connection

            assert wait_for(lambda: rt.backends.in_flight(fake.url) == 0, 10)
            assert wait_for(lambda: fake.connections_closed_by_peer >= closed + 1, 10)
            assert fake.flood_sent[stream] < FLOOD_BYTES  # cut short, not drained into the router
            statuses = rt.snapshot()["statuses"]
        assert statuses.get("client_disconnected") == 7  # 6 partial reads in _other_requests + the slow one
        assert set(statuses) == {"client_disconnected"}


def test_refused_requests_give_their_engine_connection_back(registry, registry_url):
    """An engine's 4xx answer is passed on to the client, streamed request or not, and its connection goes
    back to the pool: with one connection per engine, every request of a series is answered at once (a
    connection kept by an answered request would leave the next ones waiting for a slot until they time out)."""
    with BrokenEngine("reject") as fake:
        registry.deploy(None, name="strict", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url, fail_threshold=100, max_connections=1, read_timeout_s=5) as router:
            for stream in (True, False, True, True, False):
                body = {**STREAM_BODY, "stream": stream}
                started = time.perf_counter()
                err = openai_error(httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=30), 400)
                assert err["message"] == "bad request" and time.perf_counter() - started < 4
            assert wait_for(lambda: router.runtime.backends.in_flight(fake.url) == 0, 10)
            assert router.runtime.snapshot()["statuses"] == {"http_400": 5}
    assert fake.completion_requests == 5


def test_an_engine_gets_the_body_and_headers_as_the_router_encodes_them(registry, registry_url):
    """What reaches an engine: the client's body without the router's own field and with the engine's model
    id in place of the router alias; the client's headers without the hop-by-hop ones, the router's
    X-Polyspec-* and what the router sets itself (content type, encoding)."""
    with BrokenEngine("reject") as fake:
        registry.deploy(None, name="strict", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url, fail_threshold=100) as router:
            body = {**STREAM_BODY, "stream": False, "polyspec": {"language": "en"}}
            headers = {"Authorization": "Bearer k", "X-Request-Id": "r-1", "X-Polyspec-Explain": "1", "TE": "trailers",
                       "Accept-Encoding": "gzip"}
            resp = httpx.post(f"{router.url}/v1/chat/completions", json=body, headers=headers, timeout=30)
            assert openai_error(resp, 400)["message"] == "bad request"
            assert resp.headers["x-polyspec-backend"] == "strict"
    assert fake.last_body == {"model": fake.model_id, "stream": False, "messages": STREAM_BODY["messages"]}
    sent = fake.last_headers
    assert sent["authorization"] == "Bearer k" and sent["x-request-id"] == "r-1"
    assert sent["content-type"] == "application/json" and sent["accept-encoding"] == "identity"
    assert not any(name.startswith("x-polyspec") or name == "te" for name in sent)
