"""What the router relies on in uvicorn and prometheus_client beyond their public APIs, checked against the
installed versions: an upgrade that renames or reshapes one of these fails here, by name, before it can fail
a request. Both are pinned exactly in pyproject.toml for this reason (and in requirements.lock).

- router/edge/server.py subclasses uvicorn's httptools protocol (the only way to bound a request head) and reads
  the server's open request tasks to end them at the end of a drain.
- router/telemetry.py adds held histogram observations to the child's own sum and bucket values.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from prometheus_client import CollectorRegistry, Histogram
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from polyspec.router.edge.asgi import HOOK_KEY, ConnectionHook
from polyspec.router.edge.server import HeadLimitedHttpTools, RouterServer, head_limited_protocol
from polyspec.router.telemetry import LATENCY_BUCKETS

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {m.group(1).lower(): m.group(2) for d in deps if (m := re.fullmatch(r"([\w-]+)==([\w.]+)", d.split(";")[0]))}


@pytest.mark.parametrize("name", ["uvicorn", "prometheus-client"])
def test_the_private_api_users_are_pinned_exactly_and_installed_at_the_pin(name: str) -> None:
    pins = _pins()
    assert name in pins, f"{name} must be pinned exactly in pyproject.toml: the router uses its internals"
    lock = (ROOT / "requirements.lock").read_text().lower().replace("_", "-")
    assert f"\n{name}=={pins[name]}\n" in lock
    assert version(name) == pins[name]


def test_histogram_children_keep_bounds_sum_and_bucket_values() -> None:
    child = Histogram("h", "h", ["a"], buckets=LATENCY_BUCKETS, registry=CollectorRegistry()).labels("x")
    assert list(child._upper_bounds) == [*map(float, LATENCY_BUCKETS), math.inf]
    assert len(child._buckets) == len(child._upper_bounds)
    child._sum.inc(1.5)
    child._buckets[2].inc(3)
    assert child._sum.get() == 1.5
    assert [b.get() for b in child._buckets][:4] == [0, 0, 3, 0]
    # observe() adds to the first bucket whose bound is >= the value, and to the sum: what the held one mirrors
    child.observe(LATENCY_BUCKETS[2])
    assert child._buckets[2].get() == 4 and child._sum.get() == 1.5 + LATENCY_BUCKETS[2]


def test_the_httptools_protocol_has_the_hooks_the_head_limit_overrides() -> None:
    for name in ("connection_made", "connection_lost", "data_received", "on_headers_complete",
                 "on_message_complete", "send_400_response"):
        own, theirs = getattr(HeadLimitedHttpTools, name), getattr(HttpToolsProtocol, name)
        assert own is not theirs and callable(theirs), name
        assert list(inspect.signature(own).parameters) == list(inspect.signature(theirs).parameters), name
    for name in ("disconnected", "response_complete", "scope"):
        assert name in inspect.getsource(RequestResponseCycle.__init__), name
    assert list(inspect.signature(uvicorn.Server.shutdown).parameters) == ["self", "sockets"]
    assert list(inspect.signature(uvicorn.Server.handle_exit).parameters) == ["self", "sig", "frame"]
    assert isinstance(ServerState().tasks, set)
    assert "server_state" in inspect.getsource(RouterServer.shutdown)


class _Transport(asyncio.Transport):
    """Enough of a socket transport for a protocol fed by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_the_protocol_hooks_a_request_and_refuses_a_long_head() -> None:
    """Fed by hand: a request's scope carries the ConnectionHook, which learns the body's end and the
    client's leaving before the response is complete; a head over the limit gets 431 and no request task."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.Event().wait()  # never answers: the client leaves first

    async def main() -> None:
        rejected: list[int] = []
        config = uvicorn.Config(app, http=head_limited_protocol(512, lambda: rejected.append(1)), log_level="error",
                                lifespan="off")
        config.load()
        state = ServerState()
        proto = config.http_protocol_class(config=config, server_state=state, app_state={})
        proto.connection_made(_Transport())
        proto.data_received(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        hook = proto.scope[HOOK_KEY]
        assert isinstance(hook, ConnectionHook) and hook.body_complete
        assert len(state.tasks) == 1
        proto.connection_lost(None)
        assert proto.cycle.disconnected and hook.lost
        for task in state.tasks:
            task.cancel()
        await asyncio.gather(*state.tasks, return_exceptions=True)

        transport = _Transport()
        proto = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
        proto.connection_made(transport)
        proto.data_received(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 600 + b"\r\n\r\n")
        assert transport.written.startswith(b"HTTP/1.1 431 ") and transport.closed and rejected == [1]
        assert b"HTTP/1.1 400 " not in transport.written  # the parser error it raised is not answered again
        proto.connection_lost(None)

    asyncio.run(main())
