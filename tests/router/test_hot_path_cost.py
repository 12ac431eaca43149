"""What the hot path does instead of per-request work it used to pay:
held Prometheus updates, the connection hook of the router's own protocol, and the plain-ASGI fallbacks."""

from __future__ import annotations

import asyncio
import math
import socket
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from polyspec.router.edge.asgi import ConnectionHook, DisconnectWatch
from polyspec.router.telemetry import LATENCY_BUCKETS, Metrics, _Held, _HeldCounter, _HeldGauge, _HeldHistogram
from tests.router.conftest import metric, post_head, read_raw_response, serve_router

VALUES = [0.0, 0.01, 0.010000001, 0.05, 0.3, 1, 2.5, 299.9, 300, 301, 1e9, math.inf, -1.0, math.nan]


def _exposition(registry: CollectorRegistry) -> list[str]:
    # Creation timestamps differ between two metrics built at different times: compare the rest.
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_held_updates_expose_exactly_what_direct_updates_do():
    """A held histogram (a bisect per observation) puts every value in the bucket Histogram.observe would,
    bounds, infinities, negatives and NaN included; counters sum; a gauge keeps its last value."""
    direct, held_reg = CollectorRegistry(), CollectorRegistry()
    held = _Held()
    pairs = []
    for registry in (direct, held_reg):
        pairs.append((Histogram("h", "h", ["a"], buckets=LATENCY_BUCKETS, registry=registry).labels("x"),
                      Counter("c", "c", ["a"], registry=registry).labels("x"),
                      Gauge("g", "g", ["a"], registry=registry).labels("x")))
    (dh, dc, dg), (hh, hc, hg) = pairs
    hh, hc, hg = _HeldHistogram(hh, held), _HeldCounter(hc, held), _HeldGauge(hg, held)
    for value in VALUES:
        dh.observe(value)
        hh.observe(value)
    for amount in (1, 2.5, 0):
        dc.inc(amount)
        hc.inc(amount)
    for value in (3, 7.5):
        dg.set(value)
        hg.set(value)
    assert _exposition(held_reg) != _exposition(direct)  # nothing applied yet
    held.apply()
    assert _exposition(held_reg) == _exposition(direct)
    held.apply()  # applying twice adds nothing
    assert _exposition(held_reg) == _exposition(direct)
    with pytest.raises(ValueError):
        hc.inc(-1)  # refused on the caller's path, as prometheus_client refuses it


def test_metrics_registry_applies_held_updates_when_collected():
    metrics = Metrics()
    for _ in range(3):
        metrics.requests_of("/v1/chat/completions", "fr", "general", "b", "ok").inc()
        metrics.latency_of("/v1/chat/completions", "false").observe(0.02)
    metrics.confidence.observe(0.93)
    labels = {"endpoint": "/v1/chat/completions", "language": "fr", "domain": "general", "backend": "b", "status": "ok"}
    assert metrics.registry.get_sample_value("polyspec_requests_total", labels) == 3
    assert metrics.registry.get_sample_value("polyspec_request_latency_seconds_count",
                                             {"endpoint": "/v1/chat/completions", "stream": "false"}) == 3
    assert metrics.registry.get_sample_value("polyspec_langid_confidence_bucket", {"le": "0.95"}) == 1
    assert metrics.registry.get_sample_value("polyspec_langid_confidence_bucket", {"le": "0.9"}) == 0


def _watched(hook: ConnectionHook, lost_before: bool, lost_after_finish: bool) -> tuple[bool, bool]:
    """(cancelled, gone) of a request task whose client leaves before its watch starts or after its end."""

    async def request() -> bool:
        async def send(message: dict) -> None:
            pass

        watch = DisconnectWatch(None, send, hook)  # type: ignore[arg-type]  # the hook path never calls receive
        try:
            await asyncio.sleep(0.05)
            await watch.send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            return watch.swallow() and watch.gone
        finally:
            watch.stop()
        if lost_after_finish:
            hook.connection_lost()
        await asyncio.sleep(0.01)  # a cancel after the end would land here
        return False

    async def main() -> tuple[bool, bool]:
        if lost_before:
            hook.connection_lost()
        task = asyncio.ensure_future(request())
        swallowed = await task
        return swallowed, task.cancelled()

    return asyncio.run(main())


def test_a_client_gone_before_the_watch_starts_cancels_the_request():
    assert _watched(ConnectionHook(), lost_before=True, lost_after_finish=False) == (True, False)


def test_a_connection_closed_after_the_response_cancels_nothing():
    hook = ConnectionHook()
    assert _watched(hook, lost_before=False, lost_after_finish=True) == (False, False)
    assert hook.on_lost is None  # stop() let go of the request


@pytest.mark.parametrize("plain", [False, True], ids=["router-protocol", "plain-asgi"])
def test_a_body_sent_in_pieces_is_read_whole_and_a_stalled_one_times_out(error500, registry_url, plain):
    """The router's protocol marks a body complete only once it has all of it: a body whose second half comes
    later is read whole (the request reaches the engine), and one that stalls still gets its 408."""
    body = b'{"model": "polyspec", "messages": [{"role": "user", "content": "Hello there, how are you today?"}]}'
    with serve_router(registry_url, plain=plain, body_timeout_s=1.0, fail_threshold=100) as router:
        with socket.create_connection(("127.0.0.1", router.port)) as sock:
            sock.sendall(post_head("/v1/chat/completions", content_length=len(body)) + body[:20])
            time.sleep(0.3)
            sock.sendall(body[20:])
            status, _, answer = read_raw_response(sock, timeout=10)
            assert status == 502, answer  # the engine (error500) was asked: the body was read whole
        with socket.create_connection(("127.0.0.1", router.port)) as sock:
            sock.sendall(post_head("/v1/chat/completions", content_length=len(body)) + body[:20])
            status, _, answer = read_raw_response(sock, timeout=10)
            assert status == 408 and answer["error"]["code"] == "request_timeout", answer
        assert metric(router.url, "polyspec_rejected_requests_total", reason="body_timeout") == 1
        assert httpx.get(f"{router.url}/health", timeout=5).status_code == 200
    assert error500.completion_requests >= 1
