"""The router's client to its engines: two `EngineClient`s (router.engine.engine_http), one for traffic (a
keep-alive pool per engine) and one for health probes; read timeouts per engine (``engine_read_timeouts_s``).

Not httpx nor aiohttp: under the router benchmark httpx cost 0.66 ms of CPU per request at concurrency 1
and 1.4 ms at 64 (httpcore scans and polls every pooled connection on each request); aiohttp, used next,
about 0.12 ms more per request than router.engine.engine_http (its module docstring has the figures).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from polyspec.router.config import RouterConfig
from polyspec.router.engine.engine_http import EngineClient, EngineIOError, EngineStatusError, Response

log = logging.getLogger("polyspec.router")

# Everything a failed attempt at an engine can raise: connection errors, broken answers, timeouts.
UPSTREAM_ERRORS: tuple[type[BaseException], ...] = (EngineIOError, TimeoutError)
PROBE_CONNECTIONS = 1 << 20  # probes are few and bounded by the probe loop, not by a pool limit


def is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError)


class Upstream:
    """Two clients: traffic, pooled per engine, and health probes, on connections of their own.

    Engines are isolated from each other. The traffic pool is limited per engine (``max_connections``
    each), not in total: with one shared limit, an engine that hangs holds every connection until its
    read timeout, and requests and probes for the other engines (the default one included) queue for a
    slot, time out and are blamed on those engines, which then get marked down. Probes never queue behind
    traffic at all, so a busy engine with a full pool is not marked down either.
    """

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        headers = {"Accept-Encoding": "identity"}
        # keepalive: shorter than the engines' own idle timeout (uvicorn's 5 s in vLLM), so the router never
        # sends on a connection the engine is closing (a POST that hits that is not retried).
        self.traffic = EngineClient(config.max_connections, config.upstream_keepalive_s, config.connect_timeout_s,
                                    headers)
        self.probes = EngineClient(PROBE_CONNECTIONS, config.upstream_keepalive_s, config.connect_timeout_s, headers)
        self.default_timeout = config.read_timeout_s
        self._engine_timeouts: dict[str, float] = {}  # engine URL -> its override
        self._request_timeouts: dict[str, float] = {}  # request URL -> read timeout (a cache)
        self._unmatched: list[str] = []

    def set_replicas(self, replicas: Iterable[tuple[str, str]]) -> None:
        """Learn the (deployment name, engine URL) pairs: ``engine_read_timeouts_s`` names either."""
        overrides = {key.rstrip("/"): seconds for key, seconds in self.config.engine_read_timeouts_s.items()}
        engines, used = {}, set()
        for name, url in replicas:
            key = name if name in overrides else url.rstrip("/")
            if key in overrides:
                engines[url.rstrip("/")] = overrides[key]
                used.add(key)
        self._engine_timeouts = engines
        self._request_timeouts = {}
        unmatched = sorted(set(overrides) - used)
        if unmatched and unmatched != self._unmatched:  # a typo would otherwise go unnoticed
            log.warning("engine_read_timeouts_s names no engine of the routing table: %s", ", ".join(unmatched))
        self._unmatched = unmatched

    def timeout_for(self, url: str) -> float:
        """The read timeout (seconds) of a request to ``url`` (an engine URL plus its /v1/... path)."""
        timeout = self._request_timeouts.get(url)
        if timeout is None:
            cut = url.rfind("/v1/")
            timeout = self._engine_timeouts.get(url[:cut] if cut >= 0 else url, self.default_timeout)
            if len(self._request_timeouts) < 4096:  # engines x endpoints: bounded, but bound it anyway
                self._request_timeouts[url] = timeout
        return timeout

    async def post(self, url: str, payload: bytes, headers: Mapping[str, str] | bytes) -> Response:
        """Send one request, under its engine's read timeout (which also bounds the wait for a free
        connection); the answer's headers are read, its body is not."""
        timeout = self.timeout_for(url)
        return await self.traffic.request("POST", url, payload, headers, timeout, timeout)

    async def get(self, url: str, timeout_s: float) -> bytes:
        """GET a small document (health, model list) on the probe connections, the whole exchange within
        ``timeout_s``; an HTTP error status raises EngineStatusError."""
        async with asyncio.timeout(timeout_s):
            answer = await self.probes.request("GET", url, None, {}, timeout_s, timeout_s)
            try:
                body = await answer.read()
            finally:
                answer.release()
        if answer.status >= 400:
            raise EngineStatusError(f"HTTP {answer.status} from {url}")
        return body

    async def aclose(self) -> None:
        await self.traffic.aclose()
        await self.probes.aclose()
