"""router.engine.engine_http, the router's HTTP/1.1 client to its engines, against small asyncio servers that
misbehave on purpose: keep-alive reuse, per-engine limits and the wait for a slot, read timeouts,
connections refused, cut or garbled answers, back-pressure, cancellation, idle expiry and header
injection. What the router does with these errors is tested in tests/router/test_hot_path.py and
tests/faults/."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from polyspec.core.ports import free_port
from polyspec.router.engine.engine_http import (
    HIGH_WATER, EngineClient, EngineConnectError, EngineDisconnected, EngineProtocolError, EngineTimeout,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Engine:
    """A TCP server on 127.0.0.1 running ``handler`` per connection, counting connections and EOFs."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.eofs = 0  # connections the client closed
        self.heads: list[bytes] = []
        self.busy = 0
        self.most_busy = 0
        self.server: asyncio.AbstractServer | None = None
        self.url = ""

    async def __aenter__(self) -> Engine:
        port = free_port()
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
            if await reader.read() == b"":
                self.eofs += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            self.eofs += 1
        finally:
            writer.close()

    @classmethod
    def echoing(cls) -> Engine:
        """An engine that answers every request on a connection with its own body, keeping the connection."""
        engine = cls(lambda reader, writer: engine._echo(reader, writer))
        return engine

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            writer.write(ok(await self.read_request(reader)))

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        return await reader.readexactly(length)


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def client(limit: int = 8, keepalive_s: float = 4.0, connect_s: float = 2.0) -> EngineClient:
    return EngineClient(limit, keepalive_s, connect_s, {"Accept-Encoding": "identity"})


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


def test_answers_reuse_one_kept_alive_connection_and_echo_the_body() -> None:
    async def main() -> None:
        async with Engine.echoing() as engine:
            c = client()
            for i in range(5):
                answer = await c.request("POST", engine.url + "/v1/chat/completions", b'{"n": %d}' % i,
                                         {"X-Request-Id": "r1"}, 5, 5)
                assert (answer.status, answer.headers["content-type"]) == (200, "application/json")
                assert await answer.read() == b'{"n": %d}' % i
                answer.release()
            assert engine.connections == 1
            head = engine.heads[-1].decode()
            assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n") and "X-Request-Id: r1\r\n" in head
            assert "Content-Length: 8\r\n" in head and "Accept-Encoding: identity\r\n" in head
            await c.aclose()

    run(main())


def test_the_pool_limits_connections_per_engine_and_queues_the_rest() -> None:
    async def main() -> None:
        async def slow(reader, writer):
            while True:
                await engine.read_request(reader)
                engine.busy += 1
                engine.most_busy = max(engine.most_busy, engine.busy)
                await asyncio.sleep(0.05)
                engine.busy -= 1
                writer.write(ok(b"{}"))

        async with Engine(slow) as engine:
            c = client(limit=2)

            async def one() -> bytes:
                answer = await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 5, 5)
                try:
                    return await answer.read()
                finally:
                    answer.release()

            assert await asyncio.gather(*(one() for _ in range(10))) == [b"{}"] * 10
            assert engine.connections == 2 and engine.most_busy == 2
            await c.aclose()

    run(main())


def test_a_full_pool_times_out_within_the_pool_timeout_and_frees_its_slot_after() -> None:
    async def main() -> None:
        async def hang(reader, writer):
            await engine.read_request(reader)  # and no answer: Engine counts the client's EOF

        async with Engine(hang) as engine:
            c = client(limit=1)
            first = asyncio.ensure_future(c.request("POST", engine.url + "/v1/completions", b"{}", {}, 30, 30))
            await asyncio.sleep(0.1)
            started = time.monotonic()
            with pytest.raises(EngineTimeout, match="no free connection"):
                await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 30, 0.3)
            assert 0.25 < time.monotonic() - started < 2
            first.cancel()  # the client left: its connection closes, the slot is free again
            with pytest.raises(asyncio.CancelledError):
                await first
            await asyncio.sleep(0.1)
            assert engine.eofs == 1
            pool = next(iter(c._pools.values()))
            assert pool.open == 0 and not pool.waiters or all(w.done() for w in pool.waiters)
            await c.aclose()

    run(main())


@pytest.mark.parametrize("stall", ["before-headers", "mid-body"])
def test_silence_longer_than_the_read_timeout_raises_a_timeout(stall: str) -> None:
    async def main() -> None:
        async def silent(reader, writer):
            await engine.read_request(reader)
            if stall == "mid-body":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"6\r\ndata: \r\n")
            await asyncio.sleep(30)

        async with Engine(silent) as engine:
            c = client()
            started = time.monotonic()
            with pytest.raises(EngineTimeout) as caught:
                answer = await c.request("POST", engine.url + "/v1/chat/completions", b"{}", {}, 0.4, 5)
                assert await answer.read_chunk() == b"data: "
                await answer.read_chunk()
            assert isinstance(caught.value, TimeoutError)
            assert 0.35 < time.monotonic() - started < 3
            await c.aclose()

    run(main())


def test_a_slow_but_steady_stream_is_not_a_timeout() -> None:
    async def main() -> None:
        async def trickle(reader, writer):
            await engine.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(8):
                await asyncio.sleep(0.1)
                writer.write(b"3\r\nab\n\r\n")
            writer.write(b"0\r\n\r\n")

        async with Engine(trickle) as engine:
            c = client()
            answer = await c.request("POST", engine.url + "/v1/chat/completions", b"{}", {}, 0.3, 5)
            assert await answer.read() == b"ab\n" * 8  # 0.8 s in all, never 0.3 s of silence
            answer.release()
            await c.aclose()

    run(main())


def test_refused_cut_and_garbled_answers_raise_engine_errors() -> None:
    async def main() -> None:
        c = client()
        with pytest.raises(EngineConnectError, match="cannot connect"):
            await c.request("POST", f"http://127.0.0.1:{free_port()}/v1/completions", b"{}", {}, 5, 5)
        with pytest.raises(EngineConnectError, match="not an http"):
            await c.request("POST", "ftp://127.0.0.1/v1/completions", b"{}", {}, 5, 5)

        async def cut(reader, writer):
            await engine.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
            await writer.drain()
            writer.transport.abort()

        async with Engine(cut) as engine:
            answer = await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 5, 5)
            with pytest.raises(EngineDisconnected):
                await answer.read()
            answer.release()  # not reused: closed

        async def garbage(reader, writer):
            await engine.read_request(reader)
            writer.write(b"SPDY/9 what\r\n\r\n")

        async with Engine(garbage) as engine:
            with pytest.raises(EngineProtocolError):
                await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 5, 5)
        assert all(pool.open == 0 for pool in c._pools.values())
        await c.aclose()

    run(main())


def test_a_reused_connection_closed_before_any_answer_byte_is_retried_once_on_a_new_one() -> None:
    async def main() -> None:
        async def one_answer_then_drop(reader, writer):
            body = await engine.read_request(reader)
            writer.write(ok(body))  # kept alive ...
            await writer.drain()
            await engine.read_request(reader)  # ... and let go as the next request arrives: no answer
            writer.close()

        async with Engine(one_answer_then_drop) as engine:
            c = client()
            for i in range(3):
                answer = await c.request("POST", engine.url + "/v1/completions", b'{"n": %d}' % i, {}, 5, 5)
                assert await answer.read() == b'{"n": %d}' % i
                answer.release()
            assert engine.connections == 3 and len(engine.heads) == 5  # two requests went twice
            await c.aclose()

        async def drop_on_first(reader, writer):
            await engine.read_request(reader)
            writer.close()

        async with Engine(drop_on_first) as engine:  # a new connection closed so: the engine's failure
            c = client()
            with pytest.raises(EngineDisconnected):
                await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 5, 5)
            assert engine.connections == 1
            await c.aclose()

        async def answer_then_half_a_head(reader, writer):
            body = await engine.read_request(reader)
            writer.write(ok(body))
            await writer.drain()
            await engine.read_request(reader)
            writer.write(b"HTTP/1.1 200 O")  # part of an answer came: the request reached the engine
            await writer.drain()
            writer.close()

        async with Engine(answer_then_half_a_head) as engine:
            c = client()
            first = await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 5, 5)
            assert await first.read() == b"{}"
            first.release()
            with pytest.raises(EngineDisconnected):
                await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 5, 5)
            assert engine.connections == 1 and len(engine.heads) == 2  # not sent again
            assert all(pool.open == 0 for pool in c._pools.values())
            await c.aclose()

    run(main())


def test_an_answer_without_length_ends_with_its_connection() -> None:
    async def main() -> None:
        async def close_delimited(reader, writer):
            await engine.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
            await writer.drain()
            writer.close()

        async with Engine(close_delimited) as engine:
            c = client()
            answer = await c.request("GET", engine.url + "/health", None, {}, 5, 5)
            assert await answer.read() == b"all of it"
            answer.release()
            await c.aclose()

    run(main())


def test_a_fast_engine_cannot_fill_the_router_memory_when_nobody_reads() -> None:
    async def main() -> None:
        sent = 0

        async def flood(reader, writer):
            nonlocal sent
            await engine.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            block = b"x" * 65536
            for _ in range(320):  # 20 MiB
                writer.write(b"10000\r\n" + block + b"\r\n")
                await writer.drain()
                sent += len(block)
            writer.write(b"0\r\n\r\n")

        async with Engine(flood) as engine:
            c = client()
            answer = await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 5, 5)
            await asyncio.sleep(0.5)  # the router reads nothing for a while
            assert answer._buffered <= HIGH_WATER + 1024 * 1024  # paused: at most one read past the mark
            assert sent < 8 * 2**20  # the engine was held back by TCP, not buffered by the router
            total = 0
            while data := await answer.read_chunk():
                total += len(data)
            assert total == 320 * 65536
            answer.release()
            await c.aclose()

    run(main())


def test_cancelling_a_stream_closes_its_connection_and_frees_the_slot() -> None:
    async def main() -> None:
        async def endless(reader, writer):
            await engine.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while True:
                writer.write(b"3\r\nab\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.01)

        async with Engine(endless) as engine:
            c = client(limit=1)

            async def relay() -> None:
                answer = await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 5, 5)
                try:
                    while await answer.read_chunk():
                        pass
                finally:
                    answer.close()

            task = asyncio.ensure_future(relay())
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.2)
            assert engine.eofs == 1  # the engine saw the connection close (vLLM aborts the request so)
            pool = next(iter(c._pools.values()))
            assert pool.open == 0
            await c.aclose()

    run(main())


def test_idle_connections_close_after_the_keepalive() -> None:
    async def main() -> None:
        async def once(reader, writer):
            await engine.read_request(reader)
            writer.write(ok(b"{}"))

        async with Engine(once) as engine:
            c = client(keepalive_s=0.2)
            answer = await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 5, 5)
            assert await answer.read() == b"{}"
            answer.release()
            pool = next(iter(c._pools.values()))
            assert (pool.open, len(pool.idle)) == (1, 1)
            await asyncio.sleep(0.5)
            assert (pool.open, len(pool.idle), engine.eofs) == (0, 0, 1)
            await c.aclose()

    run(main())


def test_header_values_cannot_split_the_request() -> None:
    async def main() -> None:
        async with Engine.echoing() as engine:
            c = client()
            headers = {"X-Evil": "a\r\nX-Injected: 1", "Host": "elsewhere", "Transfer-Encoding": "chunked",
                       "Expect": "100-continue", "X-Fine": "yes"}
            answer = await c.request("POST", engine.url + "/v1/completions", b"{}", headers, 5, 5)
            await answer.read()
            answer.release()
            head = engine.heads[-1].decode()
            assert "X-Injected" not in head and "X-Evil" not in head and "elsewhere" not in head
            assert "Transfer-Encoding" not in head and "Expect" not in head and "X-Fine: yes\r\n" in head
            assert f"Host: {engine.url[7:]}\r\n" in head
            await c.aclose()

    run(main())
