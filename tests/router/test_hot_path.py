"""The completion hot path: client disconnects, routing by model id, the undetermined-language bucket,
SSE event handling and the live view the policy reads.

Engines are the failing fakes of tests/router/fakes.py; what is checked is what the router does around
them (which engine was asked, in-flight counts, telemetry), not the answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from polyspec.router.engine.stream import EventSplitter
from polyspec.core.counters import SpecCounts
from polyspec.router.table import LiveRow
from polyspec.router.telemetry import Telemetry, merge_rows
from tests.router.conftest import ServedApp, chat, router_config, serve_router, wait_for
from tests.router.fakes import BrokenEngine

UNSURE = "salut"  # fastText: fr at ~0.06, far below the tests' threshold of 0.5


@pytest.mark.parametrize("plain", [False, True], ids=["router-protocol", "plain-asgi"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_disconnect_before_the_first_byte_releases_the_replica(registry, registry_url, stream, plain):
    """The engine never answers; the client gives up. The router must notice at once (not at its own
    read timeout), close the engine connection (vLLM aborts on that) and free the in-flight slot. Served
    by the router's own protocol, the connection's end is told to the request (router.edge.asgi.ConnectionHook);
    by plain uvicorn, a watcher task learns it from receive()."""
    with BrokenEngine("hang") as fake:
        registry.deploy(None, name="hangs", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url, plain=plain, fail_threshold=5, read_timeout_s=120) as router:
            with pytest.raises(httpx.ReadTimeout):
                chat(router.url, "Hello, how are you?", stream=stream, timeout=httpx.Timeout(10, read=0.5))
            backends = router.runtime.backends
            assert wait_for(lambda: backends.in_flight(fake.url) == 0, 10), "in-flight slot never released"
            assert wait_for(lambda: fake.connections_closed_by_peer == 1, 10), "engine connection left open"
            statuses = router.runtime.telemetry.statuses
            assert wait_for(lambda: statuses.get("client_disconnected") == 1, 10)
            assert sum(statuses.values()) == 1  # counted once
            assert backends.is_healthy(fake.url)  # the client leaving is not the engine's failure


@pytest.fixture()
def two_models(registry) -> Iterator[tuple[BrokenEngine, BrokenEngine]]:
    """Engine A serves model-a (English, the default pool); engine B serves model-b (German only)."""
    with BrokenEngine("error500", model_id="model-a") as a, BrokenEngine("error500", model_id="model-b") as b:
        registry.deploy(None, name="engine-a", url=a.url, languages=["en"], default=True)
        registry.deploy(None, name="engine-b", url=b.url, languages=["de"])
        yield a, b


def test_requests_go_only_to_engines_serving_their_model(two_models, registry_url):
    a, b = two_models
    with serve_router(registry_url, fail_threshold=100) as router:
        # English for model-b: no English pool serves it, so B's German pool does (model before language).
        assert chat(router.url, "Hello, how are you today?", model="model-b").status_code == 502
        assert (a.completion_requests, b.completion_requests) == (0, 1)
        assert b.last_body["model"] == "model-b"
        # German for model-a: the German pool is B's, so the default pool (A) serves it.
        assert chat(router.url, "Wie spät ist es jetzt in Berlin?", model="model-a").status_code == 502
        assert (a.completion_requests, b.completion_requests) == (1, 1)
        missing = chat(router.url, "Hello, how are you today?", model="model-c")
        assert missing.status_code == 404
        error = missing.json()["error"]
        assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model", "invalid_request_error")
        assert "model-a" in error["message"] and "model-b" in error["message"]
        # A router alias may go anywhere (German pool first, then failover to the default pool), and each
        # engine gets its own model id.
        assert chat(router.url, "Wie spät ist es jetzt in Berlin?", model="polyspec").status_code == 502
        assert (a.completion_requests, b.completion_requests) == (2, 2)
        assert (a.last_body["model"], b.last_body["model"]) == ("model-a", "model-b")


def test_model_filter_keeps_the_language_order_and_skips_other_models(registry_url, two_models):
    from polyspec.router.decision.policy import candidate_pools, plan_attempts
    from polyspec.router.source import RegistrySource
    from polyspec.router.table import build_table

    a, b = two_models
    table = build_table(RegistrySource(registry_url).deployments(), "en")
    serving_b = frozenset({b.url})
    pools = candidate_pools(table, "en", "general", {}, 2000, serving_b)
    assert [r.url for p in pools for r in p.replicas] == [b.url]
    plan = plan_attempts(candidate_pools(table, "de", "general", {}, 2000), lambda _: True, lambda _: 0, 3, frozenset({a.url}))
    assert [t.replica.url for t in plan] == [a.url]  # B's German pool is first by language, but serves model-b
    assert plan_attempts(pools, lambda _: True, lambda _: 0, 3, frozenset()) == []


def test_uncertain_prompts_are_counted_as_undetermined(registry, registry_url, no_token):
    from polyspec.router.app import create_app

    with BrokenEngine("error500") as fake:
        registry.deploy(None, name="en-default", url=fake.url, languages=["en"], default=True)
        app = create_app(router_config(registry_url, fail_threshold=100))
        with ServedApp(app) as router:
            unsure = chat(router.url, UNSURE)
            sure = chat(router.url, "Hello, how are you today? I hope the weather is fine where you are.")
            metrics = httpx.get(f"{router.url}/metrics").text
            summary = httpx.get(f"{router.url}/admin/api/summary").json()
    # Routed to the default language's pool as before (both reached the one engine) ...
    assert unsure.status_code == sure.status_code == 502 and fake.completion_requests == 2
    # ... but counted apart from the prompts langid was sure of.
    assert 'language="und"' in metrics and 'language="en"' in metrics
    requests = {row["code"]: row["requests"] for row in summary["languages"]}
    assert requests == {"und": 1, "en": 1}
    assert "und" not in {row["language"] for row in summary["drafts"]}  # a bucket, not a language to train


class _NoRegistry:
    def deployments(self) -> list:
        return []


def _runtime(registry_url: str):
    from polyspec.router.runtime import RouterRuntime

    return RouterRuntime(router_config(registry_url), source=_NoRegistry())


def _job(source: str = "langid", stream: bool = False):
    """A job routed to one (unreachable) replica, for the bookkeeping alone; (job, target)."""
    from polyspec.router.decision.classify import Decision
    from polyspec.router.engine.job import Job
    from polyspec.router.decision.policy import Target
    from polyspec.router.table import Pool, Replica

    replica = Replica("r", "http://127.0.0.1:9")
    target = Target(Pool("draft@1", ("en",), "general", True, {}, [replica]), replica)
    decision = Decision("en", 0.2 if source == "fallback" else 0.9, "fr", "general", source, "text")
    return Job("chat", decision, [target], {}, True, True, b"", stream, False, time.perf_counter()), target


def test_acceptance_of_uncertain_prompts_goes_to_the_und_key(registry_url):
    from polyspec.router.engine.job import record

    rt = _runtime(registry_url)
    for source in ("fallback", "langid"):
        job, target = _job(source)
        record(rt, job, target, "ok", {"acceptance_histogram": [1, 2, 3, 4]}, 7)
    assert set(rt.telemetry.cumulative) == {("und", "general", "draft@1"), ("en", "general", "draft@1")}
    assert set(rt.telemetry.live_lookup()) == set(rt.telemetry.cumulative)


class _StalledStream:
    """An engine's streamed response whose body pauses after these chunks, before its end."""

    status = 200
    headers = {"content-type": "text/event-stream"}

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks, self.closed = list(chunks), False

    async def read_chunk(self) -> bytes:
        if self._chunks:
            return self._chunks.pop(0)
        await asyncio.Event().wait()  # the end of the stream is late
        return b""

    def release(self) -> None:
        raise AssertionError("released a connection whose response was not read to the end")

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("client_leaves", ["after-done", "before-done"])
def test_a_client_leaving_right_after_done_was_served_in_full(registry_url, client_leaves):
    """The openai client hangs up as soon as it reads [DONE]; the engine's end of stream may come later."""
    from polyspec.router.engine.stream import relay as _relay

    async def scenario() -> tuple:
        rt = _runtime(registry_url)
        job, target = _job(stream=True)
        sent: list[bytes] = []

        async def send(message: dict) -> None:
            sent.append(message.get("body", b""))

        tail = [USAGE, b"data: [DONE]\n\n"] if client_leaves == "after-done" else [USAGE]
        resp = _StalledStream(tail)
        relay = asyncio.ensure_future(_relay(rt, job, target, resp, EVENTS[0], send))
        assert await asyncio.wait_for(_until(lambda: resp._chunks == []), 5)
        relay.cancel()
        with pytest.raises(asyncio.CancelledError):
            await relay
        return rt.telemetry, resp, b"".join(sent)

    telemetry, resp, relayed = asyncio.run(scenario())
    assert resp.closed and USAGE not in relayed  # the client did not ask for usage
    if client_leaves == "after-done":
        assert dict(telemetry.statuses) == {"ok": 1}
        assert telemetry.cumulative[("en", "general", "draft@1")].num_spec_steps == 4  # from the usage chunk
    else:
        assert dict(telemetry.statuses) == {"client_disconnected": 1} and not telemetry.cumulative


def test_a_relay_cut_by_an_unforeseen_error_is_counted_once_as_router_error(registry_url):
    from polyspec.router.engine.stream import relay as _relay

    async def scenario() -> Telemetry:
        rt = _runtime(registry_url)
        job, target = _job(stream=True)

        async def send(message: dict) -> None:
            if message.get("body") == b"data: [DONE]\n\n":
                raise RuntimeError("the server refused the message")

        resp = _StalledStream([b"data: [DONE]\n\n"])
        with pytest.raises(RuntimeError):
            await _relay(rt, job, target, resp, EVENTS[0], send)
        assert resp.closed and job.recorded
        return rt.telemetry

    telemetry = asyncio.run(scenario())
    assert dict(telemetry.statuses) == {"router_error": 1} and not telemetry.cumulative


def test_a_classified_request_with_no_engine_is_counted(registry_url):
    """A request that was classified (its traffic counted) but found no engine gets a 503 and a status."""
    from polyspec.router.errors import NoBackend
    from polyspec.router.engine.proxy import prepare

    rt = _runtime(registry_url)  # an empty routing table: no pool at all
    raw = b'{"model": "polyspec", "messages": [{"role": "user", "content": "Hello, how are you today?"}]}'
    with pytest.raises(NoBackend):
        asyncio.run(prepare(rt, raw, {}, "chat", time.perf_counter()))
    assert dict(rt.telemetry.statuses) == {"no_backend": 1}
    assert sum(rt.telemetry.traffic.values()) == 1


async def _until(condition) -> bool:
    while not condition():
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # let the relay send what it read
    return True


def _old_relay(chunks: list[bytes], client_usage: bool) -> bytes:
    """The relay's event handling before the hot-path rewrite (one event at a time): the specification."""
    import json

    out, buffer = [], b""
    for chunk in chunks:
        buffer += chunk
        while (cut := buffer.find(b"\n\n")) >= 0:
            event, buffer = buffer[: cut + 2], buffer[cut + 2:]
            if b'"usage"' in event and event.startswith(b"data: {"):
                try:
                    obj = json.loads(event[6:])
                except ValueError:
                    obj = None
                if isinstance(obj, dict) and obj.get("choices") == [] and "usage" in obj and not client_usage:
                    continue
            out.append(event)
    return b"".join(out) + buffer


USAGE = b'data: {"choices": [], "usage": {"completion_tokens": 9}, "metrics": {"speculative_decoding": {"num_spec_steps": 4}}}\n\n'
EVENTS = [b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n', b'data: {"choices": [{"delta": {"content": "b"}}]}\n\n',
          USAGE, b"data: [DONE]\n\n"]


@pytest.mark.parametrize("client_usage", [False, True])
@pytest.mark.parametrize("cut", [1, 7, 50, 10_000], ids=lambda n: f"chunks-of-{n}")
def test_event_splitter_matches_the_old_relay(client_usage, cut):
    weird = [b"\n\n\n", b'data: {"usage": 1}\n\n', b'data: {"choices": [], "usage": null}\n\n', b"data: {bad json\n\n",
             b"\n\ndata: partial"]
    stream = b"".join(EVENTS[:2] + weird[:4] + EVENTS[2:] + weird[4:])
    chunks = [stream[i: i + cut] for i in range(0, len(stream), cut)]
    splitter = EventSplitter(client_usage)
    relayed = b"".join(splitter.feed(c) for c in chunks) + splitter.rest
    assert relayed == _old_relay(chunks, client_usage)
    assert (USAGE in relayed) == client_usage
    assert splitter.telemetry == ({"num_spec_steps": 4}, 9)


def test_live_view_is_shared_plus_pending_at_every_step():
    t = Telemetry("r")
    key, other = ("fr", "general", "d@1"), ("und", "general", "d@1")
    spec = {"acceptance_histogram": [3, 2, 1], "num_draft_tokens": 12}

    def check() -> None:
        expected = merge_rows(t.shared.values(), (LiveRow(*k, c) for k, c in t.pending.items()))
        assert {k: LiveRow(*k, c) for k, c in t.live_lookup().items()} == expected

    t.set_shared({key: LiveRow(*key, SpecCounts(requests=5, num_spec_steps=100, num_accepted_tokens=40, accepted_per_pos=(30, 10)))})
    check()
    for k in (key, other, key):
        t.observe_acceptance(k, spec, 5)
        check()
    rows = t.take_pending()
    check()
    t.observe_acceptance(key, None, 3)
    t.restore_pending(rows)
    check()
    t.observe_acceptance(other, spec, 1)
    check()
    assert t.live_lookup()[key].num_spec_steps == 100 + 2 * 6
