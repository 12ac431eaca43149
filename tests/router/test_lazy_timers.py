"""An engine connection's timers (router.engine.connections): its keep-alive and its answers' read timeout
are armed lazily and kept across requests, so a kept-alive connection serving one request after another
arms no timer per request. That the timeouts still fire is tested in tests/router/test_engine_http.py."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.router.test_engine_http import Engine, client, run


def test_a_kept_alive_connection_arms_no_timer_per_request() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        armed: list[Any] = []
        call_at = loop.call_at

        def counting_call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            armed.append(callback)
            return call_at(when, callback, *args, **kwargs)

        async with Engine.echoing() as engine:
            c = client(keepalive_s=60)
            answer = await c.request("POST", engine.url + "/v1/completions", b"{}", {}, 30, 5)  # connects
            await answer.read()
            answer.release()
            loop.call_at = counting_call_at  # type: ignore[method-assign]  # asyncio's call_later goes through it
            try:
                for i in range(20):
                    answer = await c.request("POST", engine.url + "/v1/completions", b'{"n": %d}' % i, {}, 30, 5)
                    assert await answer.read() == b'{"n": %d}' % i
                    answer.release()
            finally:
                del loop.call_at
            assert engine.connections == 1
            # the connection's timers armed at its first request are still armed: none per request
            assert armed == [], armed
            pool = next(iter(c._pools.values()))
            assert (pool.open, len(pool.idle)) == (1, 1)
            await c.aclose()

    run(main())
