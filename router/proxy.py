"""Forwarding one OpenAI request: classify, pick replicas, fail over before the first byte, stream through.

Failover happens only while nothing has been sent to the client: on connect errors, timeouts,
5xx answers, or a connection that dies before the first body byte. After that, a broken upstream
ends the stream with an SSE error event and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from router.classify import Decision, classify, parse_json_body, pop_router_fields, upstream_headers
from router.errors import BodyTooLarge, ModelNotFound, NoBackend, BadRequest, UpstreamFailed, UpstreamTimeout, sse_error
from router.policy import Target, candidate_pools, plan_attempts
from router.runtime import RouterRuntime

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class ClientGone(Exception):
    """The client disconnected while the router waited for the engine."""


@dataclass
class Job:
    kind: str
    decision: Decision
    targets: list[Target]
    body: dict[str, Any]
    headers: dict[str, str]
    stream: bool
    client_usage: bool
    started: float

    @property
    def endpoint(self) -> str:
        return PATHS[self.kind]


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"Request body is {declared} bytes; the limit is {limit}.")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"Request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


PASSED_UPSTREAM_HEADERS = ("x-request-id",)


def router_headers(decision: Decision, target: Target, upstream: httpx.Headers | None = None) -> dict[str, str]:
    passed = {k: upstream[k] for k in PASSED_UPSTREAM_HEADERS if upstream is not None and k in upstream}
    return passed | {
        "X-Polyspec-Language": decision.language,
        "X-Polyspec-Confidence": f"{decision.confidence:.4f}",
        "X-Polyspec-Domain": decision.domain,
        "X-Polyspec-Backend": target.replica.name,
        "X-Polyspec-Draft": target.pool.draft,
    }


async def prepare(rt: RouterRuntime, request: Request, kind: str) -> Job:
    raw = await read_body(request, rt.config.max_body_bytes)
    body = parse_json_body(raw)
    pins = pop_router_fields(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required.", param="model")
    if model not in rt.known_models():
        if not rt.backends.model_ids():
            raise NoBackend("No engine has answered yet; try again shortly.")
        raise ModelNotFound(f"The model '{model}' does not exist. Known: {', '.join(rt.known_models())}.", param="model")
    headers = {k.lower(): v for k, v in request.headers.items()}
    decision = classify(body, kind, headers, pins, rt.table.languages, rt.default_language,
                        rt.config.language_threshold, rt.config.langid_max_chars)
    rt.telemetry.observe_decision(decision.language, decision.domain, decision.confidence, decision.source)
    pools = candidate_pools(rt.table, decision.language, decision.domain,
                            rt.telemetry.live_lookup(), rt.config.prior_spec_steps)
    targets = plan_attempts(pools, rt.backends.is_healthy, rt.backends.in_flight, rt.config.max_attempts)
    if not targets:
        raise NoBackend(f"No healthy engine for language '{decision.language}' (domain '{decision.domain}') "
                        "nor in the default pool.")
    stream = bool(body.get("stream"))
    options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    client_usage = bool(options.get("include_usage"))
    if stream:
        # vLLM reports per-request acceptance for streams only in the usage chunk.
        body["stream_options"] = {**options, "include_usage": True}
    if rt.capture is not None and decision.source == "langid":
        await asyncio.to_thread(rt.capture.write, decision.language, decision.domain, decision.text)
    return Job(kind, decision, targets, body, upstream_headers(request.headers), stream, client_usage,
               time.perf_counter())


def _payload(rt: RouterRuntime, job: Job, target: Target) -> bytes:
    engine_model = rt.backends.model_for(target.replica.url)
    body = dict(job.body)
    if engine_model:
        body["model"] = engine_model
    return json.dumps(body, ensure_ascii=False).encode()


def _fail(rt: RouterRuntime, target: Target, reason: str, detail: str) -> None:
    rt.telemetry.metrics.upstream_errors.labels(target.replica.name, reason).inc()
    rt.backends.record_failure(target.replica.url, f"{reason}: {detail}")


def _give_up(job: Job, errors: list[tuple[str, str]]) -> Exception:
    summary = "; ".join(f"{name}: {what}" for name, what in errors)
    if errors and errors[-1][1].startswith("timeout"):
        return UpstreamTimeout(f"The engine did not answer in time ({summary}).")
    return UpstreamFailed(f"Every attempt failed ({summary}).")


def _record(rt: RouterRuntime, job: Job, target: Target | None, status: str, spec: Any = None, tokens: int = 0) -> None:
    backend = target.replica.name if target else "none"
    d = job.decision
    rt.telemetry.observe_result(job.endpoint, d.language, d.domain, backend, status)
    rt.telemetry.metrics.latency.labels(job.endpoint, str(job.stream).lower()).observe(time.perf_counter() - job.started)
    if target is not None and status == "ok":
        rt.telemetry.observe_acceptance((d.language, d.domain, target.pool.draft), spec, tokens)


def _telemetry_of(obj: Any) -> tuple[Any, int]:
    if not isinstance(obj, dict):
        return None, 0
    metrics = obj.get("metrics") if isinstance(obj.get("metrics"), dict) else {}
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
    return metrics.get("speculative_decoding"), int(usage.get("completion_tokens") or 0)


async def _unary(rt: RouterRuntime, job: Job) -> Response:
    errors: list[tuple[str, str]] = []
    for target in job.targets:
        url = target.replica.url
        rt.backends.acquire(url)
        try:
            resp = await rt.backends.client.post(url + job.endpoint, content=_payload(rt, job, target), headers=job.headers)
        except httpx.TimeoutException as exc:
            errors.append((target.replica.name, f"timeout ({type(exc).__name__})"))
            _fail(rt, target, "timeout", type(exc).__name__)
            continue
        except httpx.HTTPError as exc:
            errors.append((target.replica.name, f"{type(exc).__name__}: {exc}"))
            _fail(rt, target, "connection", type(exc).__name__)
            continue
        finally:
            rt.backends.release(url)
        if resp.status_code >= 500:
            errors.append((target.replica.name, f"HTTP {resp.status_code}"))
            _fail(rt, target, f"http_{resp.status_code}", resp.text[:200])
            continue
        spec, tokens = (None, 0)
        if resp.status_code < 400:
            try:
                spec, tokens = _telemetry_of(resp.json())
            except ValueError:
                pass
        _record(rt, job, target, "ok" if resp.status_code < 400 else f"http_{resp.status_code}", spec, tokens)
        headers = router_headers(job.decision, target, resp.headers)
        return Response(resp.content, resp.status_code, headers=headers,
                        media_type=resp.headers.get("content-type", "application/json"))
    _record(rt, job, None, "upstream_failed")
    raise _give_up(job, errors)


async def _open_stream(rt: RouterRuntime, job: Job, target: Target, errors: list[tuple[str, str]]) -> Any:
    """Send the request and wait for its first body byte. None means: try the next replica."""
    client = rt.backends.client
    url = target.replica.url
    request = client.build_request("POST", url + job.endpoint, content=_payload(rt, job, target), headers=job.headers)
    try:
        resp = await client.send(request, stream=True)
    except httpx.TimeoutException as exc:
        errors.append((target.replica.name, f"timeout ({type(exc).__name__})"))
        _fail(rt, target, "timeout", type(exc).__name__)
        return None
    except httpx.HTTPError as exc:
        errors.append((target.replica.name, f"{type(exc).__name__}: {exc}"))
        _fail(rt, target, "connection", type(exc).__name__)
        return None
    if resp.status_code >= 400:
        content = await resp.aread()
        await resp.aclose()
        if resp.status_code >= 500:
            errors.append((target.replica.name, f"HTTP {resp.status_code}"))
            _fail(rt, target, f"http_{resp.status_code}", content[:200].decode(errors="replace"))
            return None
        return Response(content, resp.status_code, headers=router_headers(job.decision, target, resp.headers),
                        media_type=resp.headers.get("content-type", "application/json"))
    chunks = resp.aiter_raw()
    try:
        first = await chunks.__anext__()
    except (httpx.HTTPError, StopAsyncIteration) as exc:
        await resp.aclose()
        timeout = isinstance(exc, httpx.TimeoutException)
        errors.append((target.replica.name, ("timeout " if timeout else "") + f"before first byte ({type(exc).__name__})"))
        _fail(rt, target, "timeout" if timeout else "early_close", type(exc).__name__)
        return None
    return resp, first, chunks


async def _stream(rt: RouterRuntime, job: Job) -> Response:
    errors: list[tuple[str, str]] = []
    for target in job.targets:
        rt.backends.acquire(target.replica.url)
        opened = await _open_stream(rt, job, target, errors)
        if opened is None or isinstance(opened, Response):
            rt.backends.release(target.replica.url)
            if isinstance(opened, Response):
                _record(rt, job, target, f"http_{opened.status_code}")
                return opened
            continue
        resp, first, chunks = opened
        rt.telemetry.metrics.ttfb.labels(job.endpoint, "true").observe(time.perf_counter() - job.started)
        headers = router_headers(job.decision, target, resp.headers) | {"Cache-Control": "no-cache"}
        return StreamingResponse(_relay(rt, job, target, resp, first, chunks), status_code=resp.status_code,
                                 headers=headers, media_type=resp.headers.get("content-type", "text/event-stream"))
    _record(rt, job, None, "upstream_failed")
    raise _give_up(job, errors)


def _usage_event(event: bytes) -> dict[str, Any] | None:
    """The final usage chunk (``"choices": []`` with ``usage``), parsed; None for any other event."""
    if b'"usage"' not in event or not event.startswith(b"data: {"):
        return None
    try:
        obj = json.loads(event[6:])
    except ValueError:
        return None
    if isinstance(obj, dict) and obj.get("choices") == [] and "usage" in obj:
        return obj
    return None


async def _relay(rt: RouterRuntime, job: Job, target: Target, resp: httpx.Response,
                 first: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Pass SSE events through unchanged; read (and, if unasked, drop) the usage chunk."""
    buffer, spec, tokens, status = first, None, 0, "ok"
    try:
        while True:
            while (cut := buffer.find(b"\n\n")) >= 0:
                event, buffer = buffer[: cut + 2], buffer[cut + 2:]
                usage = _usage_event(event)
                if usage is not None:
                    spec, tokens = _telemetry_of(usage)
                    if not job.client_usage:
                        continue
                yield event
            try:
                buffer += await chunks.__anext__()
            except StopAsyncIteration:
                break
        if buffer:
            yield buffer
    except httpx.HTTPError as exc:
        status = "stream_error"
        _fail(rt, target, "stream_drop", type(exc).__name__)
        yield sse_error(f"The engine connection broke mid-stream ({type(exc).__name__}).")
    except asyncio.CancelledError:
        status = "client_disconnected"
        raise
    finally:
        rt.backends.release(target.replica.url)
        _record(rt, job, target, status, spec, tokens)
        # Shielded: on a client disconnect this runs inside a cancelled scope, and closing the upstream
        # connection is what makes vLLM abort the request.
        with anyio.CancelScope(shield=True):
            await resp.aclose()


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def forward(rt: RouterRuntime, request: Request, kind: str) -> Response:
    job = await prepare(rt, request, kind)
    if job.stream:
        return await _stream(rt, job)
    # A non-streamed request has nothing to send until the engine finishes: watch the client meanwhile.
    work = asyncio.ensure_future(_unary(rt, job))
    watcher = asyncio.ensure_future(_until_disconnect(request))
    done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        watcher.cancel()
        return work.result()
    work.cancel()
    _record(rt, job, None, "client_disconnected")
    raise ClientGone()
