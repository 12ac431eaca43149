"""The router's HTTP server: uvicorn with a drain on SIGTERM and a bound on request heads.

`polyspec serve` (and `polyspec up`) run the app through `build_server`, never `uvicorn.run`:

- **Drain.** On SIGTERM (or Ctrl-C) /ready turns not-ready at once; the listening socket closes, idle
  connections close, and requests in flight may finish for ``drain_grace_s``. Then every request still
  open is cancelled: a stream gets an SSE error event (``router_shutdown``) and the end of its body
  (router.engine.stream), never a silent cut. uvicorn's own ``timeout_graceful_shutdown`` alone cancels the
  tasks without a word, so it is set a little later (``END_GRACE_S``) as the last resort for a client
  that reads nothing. Live stats are flushed by the app's shutdown (RouterRuntime.stop).
- **Request-head limits.** A head must arrive within ``header_timeout_s`` of its first byte (or of the
  connection), or the connection is closed: uvicorn bounds idle keep-alive connections, but not a
  client that trickles its headers (slowloris). uvicorn's httptools protocol (the fast one, picked when installed) takes
  headers of any size: httptools accumulates a header until it ends, so a 1 GB header is 1 GB of
  memory, built by repeated concatenation. `HeadLimitedHttpTools` counts the head's bytes as they come
  and answers 431 (then closes) past ``max_header_bytes``. h11 has ``h11_max_incomplete_event_size``,
  which is set too, for a server run with ``http="h11"``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from polyspec.core.errors import InvalidInput
from polyspec.core.settings import get_settings
from polyspec.router.admin.auth import unsafe_admin
from polyspec.router.edge.asgi import HOOK_KEY, ConnectionHook
from polyspec.router.config import RouterConfig
from polyspec.router.errors import error_body

if TYPE_CHECKING:  # annotations only: the runtime imports the engine side, which imports the edge
    from polyspec.router.runtime import RouterRuntime

log = logging.getLogger("polyspec.router")

END_GRACE_S = 2.0  # after the drain grace: time for cut streams to send their error event and close
LINGER_S = 1.0  # after a 431: how long the rest of the refused request is read and dropped


class HeadLimitedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bound on the request head (request line and headers).

    Bytes are counted per read while a head is incomplete, so what httptools buffers stays below the
    limit plus one read; the exact size is checked when the head ends, only for a read that could have
    crossed the limit (a usual request pays a few attribute writes, about 0.5 µs). A refused client gets
    431, then the connection is half-closed and what it still sends is read and dropped for at most
    ``LINGER_S``: closing with unread bytes would reset the connection and lose the 431.
    """

    max_head = 32 * 1024
    head_timeout_s = 10.0
    rejected: Callable[[], None] = staticmethod(lambda: None)
    timed_out: Callable[[], None] = staticmethod(lambda: None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # a connection starts by waiting for a request head
        self._head_bytes = 0  # bytes of the current head in earlier reads
        self._read = 0  # size of the read being parsed
        self._head_ended = False  # a head ended during the read being parsed
        self._too_large = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_started: float | None = None  # loop time of the current head's first byte; None: no head

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._start_head_timer()  # a connection that never sends a head is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_started = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # the response was not complete: its request must know
            hook = cast("ConnectionHook | None", cycle.scope.get(HOOK_KEY))
            if hook is not None:
                hook.connection_lost()

    def _start_head_timer(self) -> None:
        """A head begins: its clock starts. The timer is the connection's, armed lazily: a keep-alive
        connection keeps the one it has across requests (checked when it fires, `_head_check`), so a request
        pays a clock read, not a timer armed and cancelled."""
        if self._head_started is None:
            self._head_started = self.loop.time()
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_check)

    def _head_check(self) -> None:
        """The timer fired: a head that began ``head_timeout_s`` ago and has not ended (slowloris) closes the
        connection, no request task ever started; a head that began later re-arms it for the time it has
        left; with no head under way, it stays off until the next one begins."""
        self._head_timer = None
        started = self._head_started
        if started is None or not self._in_head or self.transport.is_closing():
            return
        left = started + self.head_timeout_s - self.loop.time()
        if left > 0:
            self._head_timer = self.loop.call_later(left, self._head_check)
            return
        self.timed_out()
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._too_large:
            return  # refused: the rest of what the client sends is dropped
        if self._in_head:
            self._start_head_timer()  # from the first byte of a head (an idle keep-alive has its own timeout)
        in_head, self._read, self._head_ended = self._in_head, len(data), False
        super().data_received(data)
        # A read that began and ended inside one head was all head. (One that ended a body and began the
        # next head, pipelined, is not counted: the head is then checked at its end, exactly.)
        if in_head and self._in_head and not self._head_ended and not self._too_large:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head:
                self._reject()

    def on_headers_complete(self) -> None:
        if self._head_bytes + self._read > self.max_head and self._head_size() > self.max_head:
            self._reject()
            raise ValueError("request head too large")  # stops the parser: no request task starts
        self._in_head, self._head_ended, self._head_bytes = False, True, 0
        self._head_started = None  # the head is whole: its timer, if it fires, finds nothing to check
        # router.edge.asgi: the body's end and the client's leaving (a key of ours beside the ASGI ones)
        cast("dict[str, Any]", self.scope)[HOOK_KEY] = ConnectionHook()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        hook = cast("ConnectionHook | None", self.scope.get(HOOK_KEY))
        if hook is not None:
            hook.body_complete = True
        super().on_message_complete()

    def _head_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) + 16

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers 400 to any parser error, and the exception that stopped the parser on a head
        # too large is one: that client has its 431 already.
        if not self._too_large:
            super().send_400_response(msg)

    def _reject(self) -> None:
        self._too_large = True
        transport = self.transport
        if transport.is_closing():
            return
        self.rejected()
        if self.cycle is not None and not self.cycle.response_complete:
            transport.close()  # a pipelined head while a response is still going out: no room for a 431
            return
        body = json.dumps(error_body(f"Request headers exceed the limit of {self.max_head} bytes.",
                                     "invalid_request_error", None, "request_header_too_large")).encode()
        transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        if transport.can_write_eof():
            transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER_S, transport.close)
        else:
            transport.close()


def head_limited_protocol(limit: int, rejected: Callable[[], None], timeout_s: float = 10.0,
                          timed_out: Callable[[], None] = lambda: None) -> type[HeadLimitedHttpTools]:
    """The protocol class for one server: uvicorn builds protocols itself, from the class alone."""
    return type("HeadLimitedHttpTools", (HeadLimitedHttpTools,),
                {"max_head": limit, "rejected": staticmethod(rejected), "head_timeout_s": timeout_s,
                 "timed_out": staticmethod(timed_out)})


class RouterServer(uvicorn.Server):
    """uvicorn.Server whose shutdown drains (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, runtime: RouterRuntime, grace_s: float) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.grace_s = grace_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: only plain assignments here (a metric or a log call takes locks the
        # interrupted code may hold); the rest happens in shutdown(), on the event loop.
        self.runtime.draining = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.runtime.draining = True  # also when stopped by should_exit, without a signal
        self.runtime.telemetry.metrics.draining.set(1)
        in_flight = len(self.server_state.tasks)
        log.warning("draining: /ready now answers 503; %d request(s) in flight may finish within %g s",
                    in_flight, self.grace_s)
        timer = asyncio.get_running_loop().call_later(self.grace_s, self._end_open_requests)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _end_open_requests(self) -> None:
        """The drain grace is over: cancel what is still open; a stream answers the cancellation with an
        error event and the end of its body (router.engine.stream), and is counted as ``router_shutdown``."""
        tasks = [t for t in self.server_state.tasks if not t.done()]
        if not tasks:
            return
        self.runtime.drain_expired = True
        log.error("drain grace of %g s over: ending %d open request(s) with an error", self.grace_s, len(tasks))
        for task in tasks:
            task.cancel()


def build_server(app: Any, config: RouterConfig, *, log_level: str = "info") -> RouterServer:
    """The server `polyspec serve` runs: ``build_server(app, config).run()``. `InvalidInput` when the app
    mounts the admin where it would be exposed without a token (router.admin.auth.unsafe_admin)."""
    if getattr(app.state, "admin_mounted", False):
        problem = unsafe_admin(config, get_settings().admin_token)
        if problem is not None:
            raise InvalidInput(problem)
    runtime: RouterRuntime = app.state.runtime
    rejected = runtime.telemetry.metrics.rejected.labels("header_too_large").inc
    timed_out = runtime.telemetry.metrics.rejected.labels("header_timeout").inc
    # No access log: one log record per request is a measurable share of the router's CPU, and
    # /metrics counts every request by outcome anyway. uvicorn picks uvloop (pinned) for the loop.
    # uvicorn annotates both timeouts as int but uses them as seconds of asyncio (call_later, wait_for),
    # where a float is exact.
    uv_config = uvicorn.Config(
        app, host=config.host, port=config.port, log_level=log_level, access_log=False,
        timeout_keep_alive=config.keep_alive_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=config.drain_grace_s + END_GRACE_S,  # type: ignore[arg-type]
        http=head_limited_protocol(config.max_header_bytes, rejected, config.header_timeout_s, timed_out),
        h11_max_incomplete_event_size=config.max_header_bytes,
        # The router reads X-Forwarded-For itself, from trusted_proxies only (router.admin.auth); uvicorn's
        # own handling trusts 127.0.0.1 by default and would let a local process forge a client address.
        proxy_headers=False,
    )
    return RouterServer(uv_config, runtime, config.drain_grace_s)
