"""Forwarding one OpenAI request: classify, pick replicas, fail over before the first byte, stream through.

Failover happens only while nothing has been sent to the client: on connect errors, timeouts,
5xx answers, or a connection that dies before the first body byte. After that, a broken upstream
ends the stream with an SSE error event and ``data: [DONE]`` (router.engine.stream).

`serve_completion` is a plain ASGI handler (router.edge.asgi explains why); errors still reach the client
as OpenAI error objects, and a client that disconnects cancels the request upstream. Every request that
got a routing decision is counted exactly once (``router.engine.job.record``): answered, failed, cut short or
left by its client, streamed or not.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from polyspec.router.edge.asgi import (
    HOOK_KEY, ClientDisconnected, ConnectionHook, DisconnectWatch, Receive, Scope, Send, content_type, read_body, request_headers,
    send_error, send_response,
)
from polyspec.router.edge.body import field
from polyspec.router.engine.engine_http import Response
from polyspec.router.errors import NoBackend, RouterError, RouterShutdown
from polyspec.router.engine.job import (
    Job, Opened, attempt_failed, completion_telemetry, fail, forwarded_headers, give_up, payload, record,
    router_headers,
)
from polyspec.router.decision.policy import Target
from polyspec.router.decision.routing import route
from polyspec.router.engine.stream import open_stream, relay
from polyspec.router.engine.upstream import UPSTREAM_ERRORS

if TYPE_CHECKING:  # annotations only: the runtime imports the engine side
    from polyspec.router.runtime import RouterRuntime


async def prepare(rt: RouterRuntime, raw: bytes, headers: dict[str, str], kind: str, started: float) -> Job:
    routing = route(rt, raw, headers, kind)
    decision, body, targets = routing.decision, routing.body, routing.targets
    rt.telemetry.observe_decision(decision.stats_language, decision.domain, decision.confidence, decision.source)
    stream = bool(field(body, "stream"))
    options = field(body, "stream_options")
    options = options if isinstance(options, dict) else {}
    client_usage = bool(options.get("include_usage"))
    if stream:
        # vLLM reports per-request acceptance for streams only in the usage chunk.
        body["stream_options"] = {**options, "include_usage": True}
    job = Job(kind, decision, targets, body, routing.strict, routing.serving is None, forwarded_headers(headers),
              stream, client_usage, started, routing.ranking, headers.get("x-polyspec-explain", "") in ("1", "true"))
    if not targets:
        record(rt, job, None, "no_backend")  # classified (its traffic counted), so its outcome is too
        raise NoBackend(f"No healthy engine for language '{decision.language}' (domain '{decision.domain}') "
                        "nor in the default pool.")
    if rt.capture is not None and decision.source == "langid":
        rt.capture.submit(decision.language, decision.domain, decision.text)  # never blocks, never raises
    return job


async def forward(rt: RouterRuntime, job: Job, send: Send) -> None:
    """The failover loop of both paths: try the job's replicas in order until one answers. An attempt holds
    its replica (in flight) until its answer is read whole, or, streamed, until the relay ends; a failed one
    is noted and the next replica tried, and when none is left the client gets the summary of every failure."""
    errors: list[tuple[str, str]] = []
    attempt = open_stream if job.stream else _read_whole
    for target in job.targets:
        url = target.replica.url
        rt.backends.acquire(url)
        job.begin_attempt(rt.backends.in_flight(url))
        held = True
        try:  # released however the attempt ends, a client disconnect before the first byte included
            opened = await attempt(rt, job, target, errors)
            if opened is None:
                continue
            resp, data, whole = opened
            if not whole:
                await relay(rt, job, target, resp, data, send)
                return
            held = False
            rt.backends.release(url)  # the engine is done with it before the client gets the answer
            if await _answer(rt, job, target, resp, data, errors, send):
                return
        finally:
            if held:
                rt.backends.release(url)
    record(rt, job, None, "upstream_failed")
    raise give_up(errors)


async def _read_whole(rt: RouterRuntime, job: Job, target: Target, errors: list[tuple[str, str]]) -> Opened | None:
    """A unary attempt: send the request and read the answer whole; None, noted in ``errors``, if it failed."""
    try:
        resp = await rt.backends.upstream.post(target.replica.url + job.endpoint, payload(rt, job, target), job.headers)
        try:
            content = await resp.read()
        finally:
            resp.release()  # closes the connection instead if the body was not read to the end
    except UPSTREAM_ERRORS as exc:
        attempt_failed(rt, target, errors, exc)
        return None
    return resp, content, True


async def _answer(rt: RouterRuntime, job: Job, target: Target, resp: Response, content: bytes,
                  errors: list[tuple[str, str]], send: Send) -> bool:
    """An answer read whole goes to the client, an engine's error below 500 included (it is the client's to
    see); a 5xx is noted in ``errors`` (False: try the next replica)."""
    status = resp.status
    if status >= 500:
        errors.append((target.replica.name, f"HTTP {status}"))
        fail(rt, target, f"http_{status}", content.decode(errors="replace")[:200])
        return False
    spec, tokens = completion_telemetry(content) if status < 400 else (None, 0)
    record(rt, job, target, "ok" if status < 400 else f"http_{status}", spec, tokens)
    headers = router_headers(job.decision, target, resp.headers, job)
    headers.append((b"content-type", content_type(resp.headers.get("content-type"), "application/json")))
    await send_response(send, status, headers, content)
    return True


async def _refuse(rt: RouterRuntime, scope: Scope, receive: Receive, send: Send, exc: RouterError, *,
                  close: bool = False) -> None:
    """Answer an error raised before any engine was asked; one refused before routing is counted."""
    if exc.reject_reason is not None:
        rt.telemetry.metrics.rejected.labels(exc.reject_reason).inc()
    await send_error(scope, receive, send, exc, close=close)


async def serve_completion(rt: RouterRuntime, scope: Scope, receive: Receive, send: Send, kind: str) -> None:
    """The ASGI handler of POST /v1/chat/completions and /v1/completions."""
    started = time.perf_counter()
    headers = request_headers(scope)
    config = rt.config
    hook: ConnectionHook | None = scope.get(HOOK_KEY)  # set by the router's own server (router.edge.asgi)
    try:
        raw = await read_body(receive, headers.get("content-length"), config.max_body_bytes, config.body_timeout_s,
                              complete=hook is not None and hook.body_complete)
    except RouterError as exc:  # too large or too slow: the rest of the body may still come, so close
        await _refuse(rt, scope, receive, send, exc, close=True)
        return
    except ClientDisconnected:
        return
    try:
        job = await prepare(rt, raw, headers, kind, started)
    except RouterError as exc:
        await _refuse(rt, scope, receive, send, exc)
        return
    watch = DisconnectWatch(receive, send, hook)
    ended = "router_error"  # how a request ends that did not record its own outcome
    try:
        await forward(rt, job, watch.send)
    except RouterError as exc:
        await send_error(scope, receive, watch.send, exc)
    except asyncio.CancelledError:
        if rt.drain_expired and not watch.gone and not watch.started:
            # The drain grace is over (router.edge.server cancelled this request) and nothing was sent yet: an
            # OpenAI-style 503 the client can retry elsewhere, not uvicorn's plain-text 500.
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            ended = "router_shutdown"
            await send_error(scope, receive, watch.send, RouterShutdown(
                "The router is shutting down and its drain grace ended before an engine answered; retry."))
            return
        ended = "client_disconnected" if watch.gone else "cancelled"
        if not watch.swallow():
            raise
    finally:
        watch.stop()
        # Every request is counted exactly once: the paths above record their outcome (a stream that got
        # its first byte in its relay), and what cut a request short before that is recorded here.
        if not job.recorded:
            record(rt, job, None, ended)
