"""Streamed completions: open the engine's SSE stream (failing over until its first byte), then relay it.

Events pass through unchanged, except the final usage chunk (``"choices": []`` with ``usage``): the
router always asks vLLM for it, because that is where a stream's acceptance figures are, reads it, and
drops it again when the client did not ask for usage. Back-pressure is end to end: the next engine
chunk is read only after the client's socket took the last one.

A stream always ends in a way the client can tell apart: ``data: [DONE]`` when the engine finished, or
an SSE error event (then ``[DONE]``) when the engine connection broke, when the engine ended its body
without ``[DONE]`` (``stream_incomplete``), or when the router stopped at the end of its drain grace
(``router_shutdown``, see router.edge.server). Each is counted under its own status, never as "ok".
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import msgspec

from polyspec.router.edge.asgi import Send, content_type
from polyspec.router.errors import sse_error
from polyspec.router.engine.job import (
    Job, Opened, Reported, attempt_failed, decode_reported, fail, payload, record, reported_telemetry, router_headers,
)
from polyspec.router.decision.policy import Target
from polyspec.router.engine.engine_http import Response
from polyspec.router.engine.upstream import UPSTREAM_ERRORS, is_timeout

if TYPE_CHECKING:  # annotations only: the runtime imports the engine side
    from polyspec.router.runtime import RouterRuntime

_USAGE = b'"usage"'
_DONE = b"data: [DONE]\n\n"


class _Usage(Reported):
    usage: Any = msgspec.UNSET  # present (even null) or not: only a chunk carrying the key is the usage chunk
    choices: Any = msgspec.UNSET


def usage_event(event: bytes) -> tuple[Any, int] | None:
    """The telemetry of the final usage chunk; None for any other event."""
    if _USAGE not in event or not event.startswith(b"data: {"):
        return None
    chunk = decode_reported(event[6:], _Usage)
    if chunk is None or chunk.choices != [] or chunk.usage is msgspec.UNSET:
        return None
    return reported_telemetry(chunk)


class EventSplitter:
    """Cuts the byte stream into SSE events as the relay always has (at each ``\\n\\n``, leftmost first)
    and lets the complete ones through, all of a chunk at once, minus an unasked-for usage chunk."""

    def __init__(self, client_usage: bool) -> None:
        self.client_usage = client_usage
        self.rest = b""
        self.telemetry: tuple[Any, int] = (None, 0)

    def feed(self, data: bytes) -> bytes:
        buffer = self.rest + data if self.rest else data
        end = _events_end(buffer)
        complete, self.rest = buffer[:end], buffer[end:]
        if _USAGE not in complete:  # every event but the last of a stream
            return complete
        return self._filter(complete)

    def _filter(self, complete: bytes) -> bytes:
        """``complete`` minus an unasked-for usage chunk; only an event holding ``"usage"`` is read."""
        parts, start, kept = [], 0, 0  # kept: where the bytes not yet in parts begin
        find = complete.find
        while (cut := find(b"\n\n", start)) >= 0:
            begin, start = start, cut + 2
            if find(_USAGE, begin, start) < 0:
                continue
            usage = usage_event(complete[begin:start])
            if usage is not None:
                self.telemetry = usage
                if not self.client_usage:
                    parts.append(complete[kept:begin])
                    kept = start
        if not parts:
            return complete
        parts.append(complete[kept:])
        return b"".join(parts)


def _events_end(buffer: bytes) -> int:
    """Where the complete events of ``buffer`` end: after the last ``\n\n`` of a scan that cuts at each one,
    leftmost first (0: none). That is the last ``\n\n``, found from the right, unless it ends a run of an
    odd number of newlines: the scan pairs them from the run's start, so its last pair ends one earlier."""
    cut = buffer.rfind(b"\n\n")
    if cut < 0:
        return 0
    if cut == 0 or buffer[cut - 1] != 10:  # the usual case: a run of exactly two newlines
        return cut + 2
    run = cut + 2 - len(buffer[:cut + 2].rstrip(b"\n"))  # newlines in the run (rfind: none follow it)
    return cut + 2 if run % 2 == 0 else cut + 1


async def open_stream(rt: RouterRuntime, job: Job, target: Target, errors: list[tuple[str, str]]) -> Opened | None:
    """Send the request and wait for its first body byte: (response, first bytes, False) to relay; an error
    answer of the engine read whole (response, body, True); or None, noted in ``errors``, to try the next
    replica (router.engine.proxy.forward)."""
    try:
        resp = await rt.backends.upstream.post(target.replica.url + job.endpoint, payload(rt, job, target), job.headers)
    except UPSTREAM_ERRORS as exc:
        attempt_failed(rt, target, errors, exc)
        return None
    try:
        if resp.status >= 400:
            try:
                content = await resp.read()
            finally:
                resp.release()  # closes the connection instead if the body was not read to the end
            return resp, content, True
        first = await resp.read_chunk()
    except UPSTREAM_ERRORS as exc:
        resp.close()
        timeout = is_timeout(exc)
        errors.append((target.replica.name, ("timeout " if timeout else "") + f"before first byte ({type(exc).__name__})"))
        fail(rt, target, "timeout" if timeout else "early_close", type(exc).__name__)
        return None
    except BaseException:
        resp.close()  # cancelled (the client left): closing is what makes vLLM abort
        raise
    if not first:
        resp.close()
        errors.append((target.replica.name, "before first byte (empty body)"))
        fail(rt, target, "early_close", "empty body")
        return None
    rt.telemetry.metrics.ttfb_of(job.endpoint, "true").observe(time.perf_counter() - job.started)
    return resp, first, False


async def _end(rt: RouterRuntime, target: Target, events: EventSplitter, done: bool, send: Send) -> str:
    """The engine ended its body: "ok" after ``data: [DONE]``; otherwise the answer is incomplete (an
    engine that stopped without finishing) and the client gets an error event rather than a silent end."""
    rest = events.rest
    if rest and rest.rstrip(b"\n") == _DONE.rstrip(b"\n"):  # [DONE] without its blank line
        rest, done = _DONE, True
    if done:
        if rest:
            await send({"type": "http.response.body", "body": rest, "more_body": True})
        return "ok"
    # A partial event (no blank line after it) cannot be parsed by the client: it is dropped, not relayed.
    fail(rt, target, "stream_incomplete", f"ended without [DONE] ({len(rest)} bytes of a partial event)")
    message = sse_error("The engine ended the stream without finishing it (no [DONE]).", code="stream_incomplete")
    await send({"type": "http.response.body", "body": message, "more_body": True})
    return "stream_incomplete"


async def relay(rt: RouterRuntime, job: Job, target: Target, resp: Response, first: bytes, send: Send) -> None:
    """Pass the stream on to the client, from its first bytes to its end (or an error event), and record it."""
    events = EventSplitter(job.client_usage)
    status, done, data = "router_error", False, first  # "router_error": anything unforeseen cut it short
    try:
        headers = router_headers(job.decision, target, resp.headers, job)
        headers += [(b"cache-control", b"no-cache"),
                    (b"content-type", content_type(resp.headers.get("content-type"), "text/event-stream"))]
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        while data:
            if out := events.feed(data):
                await send({"type": "http.response.body", "body": out, "more_body": True})
                done = out.endswith(_DONE)
            data = await resp.read_chunk()
        status = await _end(rt, target, events, done, send)
    except UPSTREAM_ERRORS as exc:
        status = "stream_error"
        fail(rt, target, "stream_drop", type(exc).__name__)
        message = sse_error(f"The engine connection broke mid-stream ({type(exc).__name__}).")
        await send({"type": "http.response.body", "body": message, "more_body": True})
    except asyncio.CancelledError:
        # A client may hang up as soon as it has [DONE] (the openai client does), before the engine's
        # end of stream reaches the router: that request was served in full.
        status = "ok" if done else "client_disconnected"
        if done or not rt.drain_expired:
            raise
        # The router is stopping and this stream outlived the drain grace (router.edge.server cancelled it):
        # the client gets an error event and a clean end, never a silent cut.
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        status = "router_shutdown"
        message = sse_error("The router is shutting down; the stream was cut at the end of its drain grace.",
                            "service_unavailable", "router_shutdown")
        await send({"type": "http.response.body", "body": message, "more_body": True})
    finally:
        if data == b"":
            resp.release()
        else:  # closing the connection of a stream cut short is what makes vLLM abort it
            resp.close()
        record(rt, job, target, status, *events.telemetry)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
