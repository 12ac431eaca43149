"""Plain-ASGI plumbing of the completion endpoints: body, headers, responses and client disconnects.

The two completion endpoints carry all the traffic, so they skip FastAPI's routing, dependency
injection, exception middleware and request/response objects: under the router benchmark those layers
cost more CPU per request than the proxying itself. `HotPath` sends them straight to the proxy; every
other path goes on to the FastAPI app.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from polyspec.router.errors import BodyTooLarge, RequestTimeout, RouterError, error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Scope, Receive, Send, str], Awaitable[None]]

HOT_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


class ClientDisconnected(Exception):
    """The client went away while its request body was still being read."""


HOOK_KEY = "polyspec.connection"  # the scope key of a request's ConnectionHook


class ConnectionHook:
    """What the router's own HTTP protocol (router.edge.server.HeadLimitedHttpTools) tells the request it serves,
    through ``scope[HOOK_KEY]``: whether its whole body has arrived, and when its client goes away. With it
    the hot path needs neither a timer on the body read nor a watcher task per request (`DisconnectWatch`),
    which plain ASGI needs; served by another server (tests, an embedding app), a request has no hook and
    takes the plain ASGI path."""

    __slots__ = ("body_complete", "lost", "on_lost")

    def __init__(self) -> None:
        self.body_complete = False  # the request's body has been parsed to its end
        self.lost = False  # the connection closed before the response was complete
        self.on_lost: Callable[[], None] | None = None

    def connection_lost(self) -> None:
        self.lost = True
        callback, self.on_lost = self.on_lost, None
        if callback is not None:
            callback()


class HotPath:
    """ASGI middleware: POST /v1/chat/completions and /v1/completions go to ``handler(scope, receive, send,
    kind)``, everything else to ``app``."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], handler: Handler) -> None:
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            kind = HOT_PATHS.get(scope["path"])
            if kind is not None:
                await self.handler(scope, receive, send, kind)
                return
        await self.app(scope, receive, send)


class HostGuard:
    """ASGI middleware: the DNS-rebinding guard of a router that listens on loopback. A web page whose name
    was re-pointed at 127.0.0.1 reaches the router from the browser on its host, with its own name in
    ``Host``: every HTTP request whose Host ``allowed`` refuses gets 400 (``invalid_host``) and
    ``reject()`` is told. A request without Host (no browser sends one) and /admin (which checks Host
    against its own list, router.admin.auth) pass. Host values found allowed are remembered (up to
    `KNOWN_HOSTS`), so a request of the usual kind pays one header scan and a set lookup."""

    KNOWN_HOSTS = 64

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], allowed: Callable[[str | None], bool],
                 reject: Callable[[], None], setting: str) -> None:
        self.app = app
        self.allowed = allowed
        self.reject = reject
        self.setting = setting  # named in the refusal: how to allow a name
        self._known: set[bytes] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = None
            for name, value in scope["headers"]:  # a loop, not next() over a generator: once per request
                if name == b"host":
                    host = value
                    break
            if host is not None and host not in self._known and not scope["path"].startswith("/admin"):
                if not self.allowed(host.decode("latin-1")):
                    self.reject()
                    shown = host.decode("latin-1")[:100]
                    body = json.dumps(error_body(
                        f"Invalid Host header {shown!r}: this router listens on loopback and answers only the "
                        f"names in {self.setting} (a guard against DNS rebinding).",
                        "invalid_request_error", None, "invalid_host")).encode()
                    await send_response(send, 400, [(b"content-type", b"application/json"),
                                                    (b"connection", b"close")], body)
                    return
                if len(self._known) < self.KNOWN_HOSTS:
                    self._known.add(host)
        await self.app(scope, receive, send)


class Endpoint:
    """The same handler as an ASGI endpoint for a Starlette Route (reached only if HotPath is bypassed)."""

    def __init__(self, handler: Handler, kind: str) -> None:
        self.handler = handler
        self.kind = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send, self.kind)


def request_headers(scope: Scope) -> dict[str, str]:
    """Header names lower-cased, values decoded as Latin-1 (as Starlette does); a repeated header keeps
    its last value."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def read_body(receive: Receive, declared: str | None, limit: int, timeout_s: float,
                    complete: bool = False) -> bytes:
    """The whole request body: BodyTooLarge past ``limit`` bytes, RequestTimeout when it has not all arrived
    within ``timeout_s`` seconds (a slow-body client would otherwise hold its connection and task for ever:
    uvicorn has no such limit). The deadline covers the whole body, not the silence between chunks, so a
    client trickling a byte at a time is cut off too. ``complete``: the server has the whole body already
    (`ConnectionHook.body_complete`, the usual case), so reading it cannot wait and needs no timer (about
    8-15 us under uvloop, 1-2 % of the router's CPU per request)."""
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"Request body is {declared} bytes; the limit is {limit}.")
    if complete:
        return await _receive_body(receive, limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await _receive_body(receive, limit)
    except TimeoutError:
        raise RequestTimeout(f"The request body did not arrive within {timeout_s:g} s.") from None


async def _receive_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"Request body exceeds the limit of {limit} bytes.")
        if not message.get("more_body", False):
            if not chunks:
                return chunk  # the usual case: the whole body in one message
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


def content_type(value: str | None, default: str) -> bytes:
    """Starlette's rule, kept so responses look as they did: text/* types get a charset."""
    value = value or default
    if value.startswith("text/") and "charset=" not in value.lower():
        value += "; charset=utf-8"
    return value.encode("latin-1")


async def send_response(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(scope: Scope, receive: Receive, send: Send, exc: RouterError, *, close: bool = False) -> None:
    """``exc`` as its OpenAI error response; ``close``: and close the connection after it (uvicorn does on
    ``Connection: close``), for a request whose body was not read to its end."""
    await exc.response({"connection": "close"} if close else None)(scope, receive, send)


class DisconnectWatch:
    """Cancels the request's task when the client disconnects before its response is complete.

    One watcher task per request, for its whole life: while the router waits for an engine (streamed
    or not) and while it relays a stream. Cancelling is what closes the engine connection, which makes
    vLLM abort the request, and what releases the replica's in-flight slot. ``send`` must be used for
    every response message: it marks the end of the response before the server signals it, so the
    watcher never mistakes a completed response for a disconnect.
    """

    def __init__(self, receive: Receive, send: Send, hook: ConnectionHook | None = None) -> None:
        self.gone = False
        self.started = False  # the response's start (status, headers) went out
        self._finished = False
        self._send = send
        self._task = asyncio.current_task()
        self._hook = hook
        self._watcher: asyncio.Future[None] | None = None
        if hook is None:  # plain ASGI: only receive() says the client left
            self._watcher = asyncio.ensure_future(self._watch(receive))
        elif hook.lost:  # it left while the request was being routed
            self._client_left()
        else:  # the router's own protocol calls back when the connection closes (no task)
            hook.on_lost = self._client_left

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._client_left()

    def _client_left(self) -> None:
        if not self._finished and self._task is not None:
            self.gone = True
            self._task.cancel()

    def send(self, message: Message) -> Awaitable[None]:
        """The server's ``send(message)``, after noting what it marks. A plain function returning the server's
        awaitable, not a coroutine of its own: a stream calls it once per token."""
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._finished = True
        elif message["type"] == "http.response.start":
            self.started = True
        return self._send(message)

    def swallow(self) -> bool:
        """In an ``except CancelledError``: True (and the cancellation undone) if it was this watcher's."""
        if not self.gone or self._task is None:
            return False
        self._task.uncancel()
        return True

    def stop(self) -> None:
        self._finished = True
        if self._watcher is not None:
            self._watcher.cancel()
        if self._hook is not None:
            self._hook.on_lost = None
