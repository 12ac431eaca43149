"""One engine's TCP connections for router.engine.engine_http: the errors every failure raises, a
connection carrying one answer at a time (`Connection`), and the keep-alive pool per engine (`EnginePool`:
at most ``limit`` connections, waiters served in turn, idle ones closed after ``keepalive_s``)."""

from __future__ import annotations

import asyncio
import collections
import ssl
from typing import TYPE_CHECKING

import httptools

if TYPE_CHECKING:  # annotations only: engine_http builds pools, and answers on their connections
    from polyspec.router.engine.engine_http import Response


class EngineIOError(Exception):
    """An engine could not be reached, broke its answer, or was too slow."""


class EngineConnectError(EngineIOError):
    """No connection to the engine (refused, unreachable, DNS)."""


class EngineDisconnected(EngineIOError):
    """The engine closed the connection before its answer was complete."""


class EngineProtocolError(EngineIOError):
    """The engine's bytes are not a valid HTTP/1.1 answer."""


class EngineTimeout(EngineIOError, TimeoutError):
    """The engine (or a free connection to it) did not come within the timeout."""


class EngineStatusError(EngineIOError):
    """A probe got an HTTP error status."""


class Connection(asyncio.Protocol):
    """One TCP connection to an engine, carrying one answer at a time.

    Its two timers, the keep-alive of an idle connection and the read timeout of its answer, are armed
    lazily and kept across requests: each checks, when it fires, the clock its request (or idle spell) set,
    closes or fails what is over its time and is re-armed for the time left. So a request pays clock reads,
    not two timers armed and cancelled (with uvloop, a timer is a libuv handle allocated and closed)."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.answer: Response | None = None
        self.closed = False
        self.idle_timer: asyncio.TimerHandle | None = None
        self.idle_since: float | None = None  # loop time it went back to the pool idle; None while in use
        self.read_timer: asyncio.TimerHandle | None = None  # its answers' read timeout (engine_http.Response)
        self.read_timer_at = 0.0  # loop time read_timer fires
        self.requests = 0  # requests sent on this connection: from the second on, it is a reused one

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None or answer.complete:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        answer.received = True
        try:
            answer.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            answer.fail(EngineProtocolError("the engine switched protocols"))
            self.close()
        except httptools.HttpParserError as exc:
            answer.fail(EngineProtocolError(f"invalid HTTP answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timers()
        if self.answer is not None:
            self.answer.connection_lost(exc)
        else:
            self.pool.forget_idle(self)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self._stop_timers()
            self.transport.close()

    def _stop_timers(self) -> None:
        self.idle_since = None
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if self.read_timer is not None:
            self.read_timer.cancel()
            self.read_timer = None

    def arm_read_timer(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        """Make the read timer fire by loop time ``at``: one armed to fire by then is kept."""
        if self.read_timer is not None:
            if self.read_timer_at <= at:
                return
            self.read_timer.cancel()
        self.read_timer_at = at
        self.read_timer = loop.call_at(at, self._read_check, loop)

    def _read_check(self, loop: asyncio.AbstractEventLoop) -> None:
        self.read_timer = None
        answer = self.answer
        if answer is None or self.closed:
            return  # between answers: the next one arms it again
        left = answer.expire()
        if left is not None:
            self.arm_read_timer(loop, loop.time() + left)

    def _idle_check(self, loop: asyncio.AbstractEventLoop) -> None:
        """The keep-alive timer fired: close the connection if it has been idle ``keepalive_s``, else wait
        for the time left (in use meanwhile: the timer stays off until it goes idle again)."""
        self.idle_timer = None
        since = self.idle_since
        if since is None or self.closed:
            return
        left = since + self.pool.keepalive_s - loop.time()
        if left > 0:
            self.idle_timer = loop.call_later(left, self._idle_check, loop)
        else:
            self.close()


class EnginePool:
    """The connections to one engine: idle ones (newest first), and at most ``limit`` open in all."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None, limit: int, keepalive_s: float,
                 connect_timeout_s: float) -> None:
        self.host, self.port, self.tls = host, port, tls
        self.limit = limit
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[Connection] = []
        self.open = 0  # connections counted against the limit: idle, busy or being opened
        self.waiters: collections.deque[asyncio.Future[Connection | None]] = collections.deque()
        self.counted: set[Connection] = set()

    def take_idle(self) -> Connection | None:
        while self.idle:
            conn = self.idle.pop()
            conn.idle_since = None  # in use: its keep-alive timer, if it fires, leaves it open
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
            self._uncount(conn)
        return None

    async def acquire(self, loop: asyncio.AbstractEventLoop, wait_s: float, *, fresh: bool = False) -> Connection:
        """An idle connection (unless ``fresh``), else a new one once the limit allows."""
        conn = None if fresh else self.take_idle()
        if conn is not None:
            return conn
        if self.open >= self.limit:
            conn = await self._wait_turn(loop, wait_s)
            if conn is not None:
                return conn  # else a slot was kept for this request (`_slot_freed`)
        else:
            self.open += 1  # a slot of its own, taken before the connect so that others count it
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: Connection(self), self.host, self.port, ssl=self.tls)
        except TimeoutError:
            self._slot_freed()
            raise EngineTimeout(
                f"connecting to {self.host}:{self.port} took over {self.connect_timeout_s:g} s") from None
        except OSError as exc:
            self._slot_freed()
            raise EngineConnectError(f"cannot connect to {self.host}:{self.port} ({exc})") from exc
        except BaseException:
            self._slot_freed()
            raise
        self.counted.add(conn)
        return conn

    async def _wait_turn(self, loop: asyncio.AbstractEventLoop, wait_s: float) -> Connection | None:
        """Wait for an idle connection (returned) or a free slot (None)."""
        turn: asyncio.Future[Connection | None] = loop.create_future()
        self.waiters.append(turn)
        try:
            async with asyncio.timeout(wait_s):
                return await turn
        except BaseException as exc:
            if turn.done() and not turn.cancelled():
                self._pass_on(turn.result())  # handed over, then timed out or cancelled: the next in line's
            else:
                turn.cancel()
            if isinstance(exc, TimeoutError):
                raise EngineTimeout(f"no free connection to {self.host}:{self.port} within {wait_s:g} s "
                                    f"({self.limit} in use)") from None
            raise

    def _pass_on(self, conn: Connection | None) -> None:
        if conn is None:
            self._slot_freed()
        else:
            self.put_back(conn)

    def put_back(self, conn: Connection) -> None:
        while self.waiters:
            turn = self.waiters.popleft()
            if not turn.done():
                turn.set_result(conn)
                return
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        if conn.idle_timer is None:
            conn.idle_timer = loop.call_later(self.keepalive_s, conn._idle_check, loop)
        self.idle.append(conn)

    def discard(self, conn: Connection) -> None:
        """A connection that will not be reused (closed or closing)."""
        self._uncount(conn)

    def forget_idle(self, conn: Connection) -> None:
        """An idle connection closed (keep-alive ended, or the engine closed it)."""
        if conn in self.idle:
            self.idle.remove(conn)
        self._uncount(conn)

    def _uncount(self, conn: Connection) -> None:
        if conn in self.counted:
            self.counted.discard(conn)
            self._slot_freed()

    def _slot_freed(self) -> None:
        self.open -= 1
        while self.waiters:
            turn = self.waiters.popleft()
            if not turn.done():
                self.open += 1  # the waiter opens a connection of its own in this slot
                turn.set_result(None)
                return

    def close(self) -> None:
        for conn in list(self.idle):
            conn.close()
        self.idle.clear()
