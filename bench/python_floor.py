"""The Python floor of a router: a benchmark backend, never a product part.

The same HTTP server as `polyspec serve` (uvicorn with httptools and uvloop, no access log, no proxy
headers) in front of the same upstream client (router.engine.engine_http, a keep-alive pool per engine), and nothing
else: no language ID, no policy, no telemetry, no header checks. A POST to /v1/... is forwarded to the
backend as it came and the answer relayed (a stream read by read, as `router.engine.stream` relays it).

bench/router_overhead.py runs it as the ``python_floor`` system, beside polyspec and vllm-router in one
run: what it costs per request is what any router built on this stack pays before doing anything, so
polyspec's CPU per request minus the floor's is what polyspec's own work costs, and the floor bounds
what optimising that work can reach.

``--server`` puts the same forwarding under another HTTP server, for bench/server_floor.py, which asks
whether a different server would lower that floor: granian (Rust HTTP, one worker, one runtime thread,
uvloop) through its ASGI interface (``Floor`` as it is) or its own RSGI interface (``RsgiFloor``: the same
upstream client, granian's response calls instead of ASGI messages).

    .venv/bin/python bench/python_floor.py --port 8500 --backend http://127.0.0.1:8400 [--server granian-rsgi]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

from polyspec.router.engine.engine_http import EngineClient

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_JSON = [(b"content-type", b"application/json")]
SERVERS = ("uvicorn", "granian-asgi", "granian-rsgi")
BACKEND_ENV = "POLYSPEC_FLOOR_BACKEND"  # how a granian worker (which imports a factory) learns the backend


class Floor:
    """Raw ASGI: /health answers, POST /v1/... is forwarded to ``backend``; everything else is a 404."""

    def __init__(self, backend: str) -> None:
        self.backend = backend.rstrip("/")
        self.client: EngineClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] != "http":
            return
        elif scope["path"] == "/health":
            await _send_whole(send, 200, b'{"status":"ok"}')
        elif scope["method"] == "POST" and scope["path"].startswith("/v1/"):
            await self._forward(scope, receive, send)
        else:
            await _send_whole(send, 404, b'{"error":"not found"}')

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.client = EngineClient(1024, 4.0, 5.0, {"Accept-Encoding": "identity"})
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.client is not None:
                    await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        assert self.client is not None
        resp = await self.client.request("POST", self.backend + scope["path"], body,
                                         {"content-type": "application/json"}, 300.0, 300.0)
        try:
            kind = resp.headers.get("content-type", "application/json").encode()
            await send({"type": "http.response.start", "status": resp.status, "headers": [(b"content-type", kind)]})
            if kind.startswith(b"text/event-stream"):
                while data := await resp.read_chunk():
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await send({"type": "http.response.body", "body": await resp.read(), "more_body": False})
        finally:
            resp.release()


async def _send_whole(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _JSON})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class RsgiFloor:
    """The floor on granian's RSGI interface: /health answers, POST /v1/... is forwarded to ``backend`` with
    the same upstream client; everything else is a 404."""

    def __init__(self, backend: str) -> None:
        self.backend = backend.rstrip("/")
        self.client: EngineClient | None = None

    def __rsgi_init__(self, loop: Any) -> None:
        self.client = EngineClient(1024, 4.0, 5.0, {"Accept-Encoding": "identity"})

    def __rsgi_del__(self, loop: Any) -> None:
        if self.client is not None:
            loop.run_until_complete(self.client.aclose())

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.path == "/health":
            proto.response_bytes(200, [("content-type", "application/json")], b'{"status":"ok"}')
            return
        if scope.method != "POST" or not scope.path.startswith("/v1/"):
            proto.response_bytes(404, [("content-type", "application/json")], b'{"error":"not found"}')
            return
        body = await proto()
        assert self.client is not None
        resp = await self.client.request("POST", self.backend + scope.path, body,
                                         {"content-type": "application/json"}, 300.0, 300.0)
        try:
            kind = resp.headers.get("content-type", "application/json")
            if kind.startswith("text/event-stream"):
                transport = proto.response_stream(resp.status, [("content-type", kind)])
                while data := await resp.read_chunk():
                    await transport.send_bytes(data)
            else:
                proto.response_bytes(resp.status, [("content-type", kind)], await resp.read())
        finally:
            resp.release()


def asgi_app() -> Floor:
    """granian's factory for ``--server granian-asgi``."""
    return Floor(os.environ[BACKEND_ENV])


def rsgi_app() -> RsgiFloor:
    """granian's factory for ``--server granian-rsgi``."""
    return RsgiFloor(os.environ[BACKEND_ENV])


def _granian(interface: str, port: int, backend: str) -> None:
    from granian import Granian  # a dev pin (pyproject's dev extra): only this benchmark uses it

    os.environ[BACKEND_ENV] = backend
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the worker imports python_floor:...
    # As the uvicorn floor: one process serving, one thread of Python, uvloop, no access log.
    Granian(f"python_floor:{interface}_app", address="127.0.0.1", port=port, interface=interface, workers=1,
            runtime_threads=1, loop="uvloop", websockets=False, log_access=False, log_level="warning",
            factory=True).serve()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", required=True, help="base URL of the OpenAI-compatible backend")
    ap.add_argument("--server", choices=SERVERS, default="uvicorn", help="HTTP server (default: uvicorn, as polyspec)")
    args = ap.parse_args()
    if args.server == "uvicorn":
        uvicorn.run(Floor(args.backend), host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                    http="httptools", loop="uvloop", proxy_headers=False, timeout_keep_alive=75)
    else:
        _granian(args.server.removeprefix("granian-"), args.port, args.backend)


if __name__ == "__main__":
    main()
