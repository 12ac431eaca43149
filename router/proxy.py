"""Forwarding one OpenAI request: classify, pick replicas, fail over before the first byte, stream through.

Failover happens only while nothing has been sent to the client: on connect errors, timeouts,
5xx answers, or a connection that dies before the first body byte. After that, a broken upstream
ends the stream with an SSE error event and ``data: [DONE]`` (router.stream).

`serve_completion` is a plain ASGI handler (router.asgi explains why); errors still reach the client
as OpenAI error objects, and a client that disconnects cancels the request upstream. Every request that
got a routing decision is counted exactly once (``router.job.record``): answered, failed, cut short or
left by its client, streamed or not.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from polyspec.router.asgi import (
    ClientDisconnected, DisconnectWatch, Receive, Scope, Send, content_type, read_body, request_headers,
    send_error, send_response,
)
from polyspec.router.classify import classify, decode_body, pop_router_fields, upstream_headers
from polyspec.router.errors import BadRequest, ModelNotFound, NoBackend, RouterError
from polyspec.router.job import Job, attempt_failed, completion_telemetry, fail, give_up, payload, record, router_headers
from polyspec.router.policy import candidate_pools, plan_attempts
from polyspec.router.runtime import RouterRuntime
from polyspec.router.stream import stream
from polyspec.router.upstream import UPSTREAM_ERRORS


def _model_filter(rt: RouterRuntime, model: Any) -> frozenset[str] | None:
    """URLs of the replicas that may serve ``model``; None for a router alias (any replica)."""
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required.", param="model")
    if model in rt.config.model_aliases:
        return None
    serving = rt.backends.serving(model)
    if not serving:
        if not rt.backends.model_ids():
            raise NoBackend("No engine has answered yet; try again shortly.")
        raise ModelNotFound(f"The model '{model}' does not exist. Known: {', '.join(rt.known_models())}.", param="model")
    return serving


async def prepare(rt: RouterRuntime, raw: bytes, headers: dict[str, str], kind: str, started: float) -> Job:
    body, strict = decode_body(raw)
    pins = pop_router_fields(body)
    serving = _model_filter(rt, body.get("model"))
    table = rt.table
    decision = classify(body, kind, headers, pins, table.languages, rt.default_language,
                        rt.config.language_threshold, rt.config.langid_max_chars, allowed=rt.langid_labels(table))
    rt.telemetry.observe_decision(decision.stats_language, decision.domain, decision.confidence, decision.source)
    pools = candidate_pools(table, decision.language, decision.domain, rt.telemetry.live_lookup(),
                            rt.config.prior_spec_steps, serving)
    targets = plan_attempts(pools, rt.backends.is_healthy, rt.backends.in_flight, rt.config.max_attempts, serving)
    stream = bool(body.get("stream"))
    options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    client_usage = bool(options.get("include_usage"))
    if stream:
        # vLLM reports per-request acceptance for streams only in the usage chunk.
        body["stream_options"] = {**options, "include_usage": True}
    job = Job(kind, decision, targets, body, strict, serving is None, upstream_headers(headers), stream,
              client_usage, started)
    if not targets:
        record(rt, job, None, "no_backend")  # classified (its traffic counted), so its outcome is too
        raise NoBackend(f"No healthy engine for language '{decision.language}' (domain '{decision.domain}') "
                        "nor in the default pool.")
    if rt.capture is not None and decision.source == "langid":
        await asyncio.to_thread(rt.capture.write, decision.language, decision.domain, decision.text)
    return job


async def _unary(rt: RouterRuntime, job: Job, send: Send) -> None:
    errors: list[tuple[str, str]] = []
    for target in job.targets:
        url = target.replica.url
        rt.backends.acquire(url)
        try:
            resp = await rt.backends.upstream.post(url + job.endpoint, payload(rt, job, target), job.headers)
            try:
                content = await resp.read()
            finally:
                resp.release()  # closes the connection instead if the body was not read to the end
        except UPSTREAM_ERRORS as exc:
            attempt_failed(rt, target, errors, exc)
            continue
        finally:
            rt.backends.release(url)
        status = resp.status
        if status >= 500:
            errors.append((target.replica.name, f"HTTP {status}"))
            fail(rt, target, f"http_{status}", content.decode(errors="replace")[:200])
            continue
        spec, tokens = completion_telemetry(content) if status < 400 else (None, 0)
        record(rt, job, target, "ok" if status < 400 else f"http_{status}", spec, tokens)
        headers = router_headers(job.decision, target, resp.headers)
        headers.append((b"content-type", content_type(resp.headers.get("content-type"), "application/json")))
        await send_response(send, status, headers, content)
        return
    record(rt, job, None, "upstream_failed")
    raise give_up(errors)


async def serve_completion(rt: RouterRuntime, scope: Scope, receive: Receive, send: Send, kind: str) -> None:
    """The ASGI handler of POST /v1/chat/completions and /v1/completions."""
    started = time.perf_counter()
    headers = request_headers(scope)
    try:
        raw = await read_body(receive, headers.get("content-length"), rt.config.max_body_bytes)
        job = await prepare(rt, raw, headers, kind, started)
    except RouterError as exc:
        await send_error(scope, receive, send, exc)
        return
    except ClientDisconnected:
        return
    watch = DisconnectWatch(receive, send)
    ended = "router_error"  # how a request ends that did not record its own outcome
    try:
        await (stream(rt, job, watch.send) if job.stream else _unary(rt, job, watch.send))
    except RouterError as exc:
        await send_error(scope, receive, watch.send, exc)
    except asyncio.CancelledError:
        ended = "client_disconnected" if watch.gone else "cancelled"
        if not watch.swallow():
            raise
    finally:
        watch.stop()
        # Every request is counted exactly once: the paths above record their outcome (a stream that got
        # its first byte in its relay), and what cut a request short before that is recorded here.
        if not job.recorded:
            record(rt, job, None, ended)
