"""The router's HTTP/1.1 client to its engines: asyncio protocols, httptools' response parser, and a
keep-alive pool per engine.

Why not a general client: the router is CPU-bound on its event loop, and the client was the largest
share of what a request costs it. Side by side in one bench/router_overhead.py run (2 cores, the same
uvicorn server in front), a bare relay on aiohttp's client cost 0.26-0.44 ms of CPU per request, and
the same relay on this module 0.14-0.30 ms; pyreqwest (Rust, its own thread) 0.23-0.45 ms. The router
needs little of a general client: HTTP/1.1 to engines it knows, a POST of a body it holds whole, GETs for
health probes, and an answer read whole or chunk by chunk. Parsing is httptools' (llhttp, the parser of
uvicorn and Node.js); this module (with router.engine.connections, which holds the connections
and pools) owns only connections, pools and timeouts.

What it keeps from the aiohttp session it replaced:

- **Pools per engine.** At most ``limit`` connections to one engine (scheme, host, port); a request
  waits for a slot within its ``pool_timeout_s``, and the TCP connect itself is bounded by
  ``connect_timeout_s``. Idle connections close after ``keepalive_s``.
- **Read timeout.** The longest silence allowed while the router waits for the engine (its headers or
  its next body bytes); time the router spends not reading (a slow client) does not count.
- **Back-pressure.** Past ``HIGH_WATER`` unread bytes the connection stops reading from the engine until
  the router takes them, so a fast engine and a slow client cannot fill the router's memory.
- **Reuse only when clean.** A connection goes back to its pool only after an answer read to its end
  with keep-alive; an answer cut short closes it, which is what makes vLLM abort the request. A reused
  connection the engine closed before any byte of an answer gets the request once more, on a new one.

Every failure raises an `EngineIOError`; a timeout also is a `TimeoutError`.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

import httptools

from polyspec.router.engine.connections import (
    Connection, EngineConnectError, EngineDisconnected, EngineIOError, EnginePool, EngineProtocolError,
    EngineStatusError, EngineTimeout,
)

# The errors are the connections' (router.engine.connections); callers import them from here, with the client.
__all__ = ["HIGH_WATER", "HOP_BY_HOP", "EngineClient", "EngineConnectError", "EngineDisconnected", "EngineIOError",
           "EngineProtocolError", "EngineStatusError", "EngineTimeout", "Response", "header_lines"]

HIGH_WATER = 256 * 1024  # unread bytes of one answer before reading from the engine pauses
# The one list of headers never passed on to an engine: hop-by-hop ones, and those this client sets itself
# (host, content-length) or never honours (expect: it does not wait for 100-continue).
HOP_BY_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "expect", "te",
                        "trailer", "upgrade", "proxy-connection"})


class Response:
    """An engine's answer: ``status`` and ``headers`` (names lower-cased) once `EngineClient.request`
    returns; the body through `read` or `read_chunk`; then `release` (reuse the connection if the body was
    read to its end) or `close`."""

    __slots__ = ("_conn", "_pool", "parser", "status", "headers", "_chunks", "_buffered", "_paused", "complete",
                 "_headers_done", "_delimited", "_keep_alive", "_error", "_waiter", "_last", "_read_timeout_s",
                 "_loop", "_finished", "received")

    def __init__(self, conn: Connection, pool: EnginePool, read_timeout_s: float,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self.complete = False  # the parser saw the end of the answer
        self._headers_done = False
        self._delimited = False  # content-length or chunked: the end is in the bytes, not the close
        self._keep_alive = False  # the engine keeps the connection open after this answer
        self._error: EngineIOError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._last = 0.0
        self._read_timeout_s = read_timeout_s
        self._loop = loop
        self._finished = False  # released or closed
        self.received = False  # any byte of the answer came

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        self.headers[key] = value.decode("latin-1")
        if key == "content-length" or (key == "transfer-encoding" and b"chunked" in value.lower()):
            self._delimited = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status < 200:  # 1xx: an interim answer; the real one follows on the same connection
            self.headers = {}
            self._delimited = False
            return
        self._headers_done = True
        self._keep_alive = self.parser.should_keep_alive()  # known from the head (llhttp forgets it at the end)
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status < 200:
            return
        self.complete = True
        self._wake()

    # connection events
    def fail(self, error: EngineIOError) -> None:
        if self._error is None and not self.complete:
            self._error = error
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._headers_done and not self._delimited and not self.complete:
            self.complete = True  # an answer without length or chunks ends when its connection does
        elif not self.complete:
            self.fail(EngineDisconnected(f"the engine closed the connection ({type(exc).__name__ if exc else 'EOF'})"))
        self._wake()

    def _wake(self) -> None:
        self._last = self._loop.time()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def expire(self) -> float | None:
        """The read timeout's check, when its connection's timer fires (`Connection.arm_read_timer`: re-armed
        lazily, so data arriving costs no timer call): fails the answer after ``read_timeout_s`` of silence
        while the router waits for it; else the seconds until the next check (None: no more checks)."""
        if self._finished or self.complete or self._error is not None:
            return None
        left = self._last + self._read_timeout_s - self._loop.time()
        if self._waiter is not None and not self._waiter.done() and left <= 0:
            self.fail(EngineTimeout(f"the engine sent nothing for {self._read_timeout_s:g} s"))
            return None
        return max(left, 0.0) if self._waiter is not None else self._read_timeout_s

    async def _wait(self) -> None:
        self._last = now = self._loop.time()
        self._conn.arm_read_timer(self._loop, now + self._read_timeout_s)
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def wait_headers(self) -> None:
        while not self._headers_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read_chunk(self) -> bytes:
        """What the engine sent since the last call (waiting for something if nothing came yet); b"" at the
        end of the answer."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            await self._wait()
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused and self._conn.transport is not None:
            self._paused = False
            self._conn.transport.resume_reading()
        return data

    async def read(self) -> bytes:
        """The rest of the body, whole."""
        parts = []
        while data := await self.read_chunk():
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool if the answer was read to its end and
        the engine keeps it alive, and is closed otherwise."""
        if self._finished:
            return
        reusable = self.complete and not self._chunks and self._error is None and self._keep_alive
        self._finish(reusable)

    def close(self) -> None:
        """Done with the answer, read or not: its connection is closed (an engine aborts a stream so)."""
        if not self._finished:
            self._finish(False)

    def _finish(self, reusable: bool) -> None:
        self._finished = True  # the connection's read timer, if armed, finds no answer of its own any more
        conn = self._conn
        conn.answer = None
        if reusable and not conn.closed:
            self._pool.put_back(conn)
        else:
            conn.close()
            self._pool.discard(conn)


class EngineClient:
    """HTTP/1.1 requests to engines, over one keep-alive pool per engine (see the module docstring)."""

    def __init__(self, limit_per_engine: int, keepalive_s: float, connect_timeout_s: float,
                 default_headers: Mapping[str, str] | None = None) -> None:
        self.limit = limit_per_engine
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self._pools: dict[tuple[str, str, int], EnginePool] = {}
        self._targets: dict[str, tuple[EnginePool, bytes, bytes]] = {}  # URL -> (pool, path, Host header line)
        self._default = header_lines(default_headers or {})
        self._tls: ssl.SSLContext | None = None

    def _target(self, url: str) -> tuple[EnginePool, bytes, bytes]:
        target = self._targets.get(url)
        if target is not None:
            return target
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineConnectError(f"not an http(s) URL: {url!r}")
        tls = None
        if parts.scheme == "https":
            self._tls = self._tls or ssl.create_default_context()
            tls = self._tls
        try:
            port = parts.port or (443 if tls else 80)
        except ValueError as exc:
            raise EngineConnectError(f"bad port in {url!r}") from exc
        key = (parts.scheme, parts.hostname, port)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = EnginePool(parts.hostname, port, tls, self.limit, self.keepalive_s,
                                            self.connect_timeout_s)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        target = (pool, path.encode("latin-1"), f"Host: {parts.netloc}\r\n".encode("latin-1"))
        if len(self._targets) < 4096:  # engines x endpoints: small, but bounded anyway
            self._targets[url] = target
        return target

    async def request(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str] | bytes,
                      read_timeout_s: float, pool_timeout_s: float) -> Response:
        """Send one request and wait for the answer's status and headers; its body is not read yet.
        ``headers``: a mapping, or its lines as `header_lines` encoded them (a request tried on several
        engines encodes them once).

        A keep-alive connection the engine closes as the request goes out (idle too long on its side, or
        the engine restarted) ends before any byte of an answer. That request is sent once more, on a new
        connection, as Go's net/http does for a reused connection and a request it may replay; a completion
        may be replayed here, since vLLM aborts a request whose connection closed. A new connection that
        closes so is the engine's failure, raised as `EngineDisconnected`."""
        pool, path, host = self._target(url)
        lines = headers if isinstance(headers, bytes) else header_lines(headers)
        head = [method.encode("latin-1"), b" ", path, b" HTTP/1.1\r\n", host, self._default, lines]
        if body is not None:
            head.append(b"Content-Length: %d\r\n\r\n" % len(body))
            head.append(body)
        else:
            head.append(b"\r\n")
        data = b"".join(head)
        loop = asyncio.get_running_loop()
        conn = await pool.acquire(loop, pool_timeout_s)
        while True:
            reused = conn.requests > 0
            conn.requests += 1
            answer = Response(conn, pool, read_timeout_s, loop)
            conn.answer = answer
            try:
                conn.transport.write(data)  # type: ignore[union-attr]
                await answer.wait_headers()
            except EngineDisconnected:
                answer.close()
                if not reused or answer.received:
                    raise
                conn = await pool.acquire(loop, pool_timeout_s, fresh=True)
                continue
            except BaseException:
                answer.close()  # cancelled or failed before its headers: the connection cannot be reused
                raise
            return answer

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._targets.clear()


def header_lines(headers: Mapping[str, str], skipped: frozenset[str] = HOP_BY_HOP,
                 skipped_prefix: str | None = None) -> bytes:
    """Header lines, minus ``skipped`` names (lower case; by default `HOP_BY_HOP`) and those starting with
    ``skipped_prefix``; a value with a line break is dropped, never sent (it would split the request)."""
    lines = []
    for name, value in headers.items():
        lower = name.lower()
        if (lower in skipped or (skipped_prefix is not None and lower.startswith(skipped_prefix))
                or "\r" in value or "\n" in value or "\r" in name or "\n" in name):
            continue
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1", errors="replace")
