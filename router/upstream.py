"""The router's HTTP client to its engines: aiohttp sessions, one for traffic (a keep-alive pool per engine)
and one for health probes; read timeouts per engine (``engine_read_timeouts_s``).

aiohttp rather than httpx: under the router benchmark httpx cost 0.66 ms of CPU per request at
concurrency 1 and 1.4 ms at 64 (httpcore scans and polls every pooled connection on each request),
aiohttp 0.19 and 0.12 ms. The session is created on first use, inside the serving event loop, because
aiohttp binds a session to the loop it was created in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import aiohttp

from polyspec.router.config import RouterConfig

log = logging.getLogger("polyspec.router")

# Everything a failed attempt at an engine can raise: connection errors, broken payloads, timeouts.
UPSTREAM_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, asyncio.TimeoutError)


def is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, asyncio.TimeoutError)


class Upstream:
    """Two sessions: traffic, pooled per engine, and health probes, on connections of their own.

    Engines are isolated from each other. The traffic pool is limited per engine (``max_connections``
    each), not in total: with one shared limit, an engine that hangs holds every connection until its
    read timeout, and requests and probes for the other engines (the default one included) queue for a
    slot, time out and are blamed on those engines, which then get marked down. Probes never queue behind
    traffic at all, so a busy engine with a full pool is not marked down either.
    """

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None
        self._probes: aiohttp.ClientSession | None = None
        self.default_timeout = self._timeout(config.read_timeout_s)
        self._engine_timeouts: dict[str, aiohttp.ClientTimeout] = {}  # engine URL -> its override
        self._request_timeouts: dict[str, aiohttp.ClientTimeout] = {}  # request URL -> timeouts (a cache)
        self._unmatched: list[str] = []

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._new_session()
        return self._session

    @property
    def probes(self) -> aiohttp.ClientSession:
        if self._probes is None or self._probes.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self.config.upstream_keepalive_s)
            self._probes = aiohttp.ClientSession(connector=connector, headers={"Accept-Encoding": "identity"})
        return self._probes

    def _new_session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=0, limit_per_host=self.config.max_connections,  # per engine: see the class docstring
            # Shorter than the engines' own idle timeout (uvicorn's 5 s in vLLM), so the router never
            # sends on a connection the engine is closing: aiohttp does not retry a POST that hits that.
            keepalive_timeout=self.config.upstream_keepalive_s,
        )
        return aiohttp.ClientSession(connector=connector, timeout=self.default_timeout,
                                     headers={"Accept-Encoding": "identity"})

    def _timeout(self, read_s: float) -> aiohttp.ClientTimeout:
        # sock_read: the longest silence allowed from an engine (between any two reads, as before with
        # httpx's read timeout); connect: waiting for a pool slot plus connecting.
        return aiohttp.ClientTimeout(total=None, connect=read_s, sock_connect=self.config.connect_timeout_s,
                                     sock_read=read_s)

    def set_replicas(self, replicas: Iterable[tuple[str, str]]) -> None:
        """Learn the (deployment name, engine URL) pairs: ``engine_read_timeouts_s`` names either."""
        overrides = {key.rstrip("/"): seconds for key, seconds in self.config.engine_read_timeouts_s.items()}
        engines, used = {}, set()
        for name, url in replicas:
            key = name if name in overrides else url.rstrip("/")
            if key in overrides:
                engines[url.rstrip("/")] = self._timeout(overrides[key])
                used.add(key)
        self._engine_timeouts = engines
        self._request_timeouts = {}
        unmatched = sorted(set(overrides) - used)
        if unmatched and unmatched != self._unmatched:  # a typo would otherwise go unnoticed
            log.warning("engine_read_timeouts_s names no engine of the routing table: %s", ", ".join(unmatched))
        self._unmatched = unmatched

    def timeout_for(self, url: str) -> aiohttp.ClientTimeout:
        """The timeouts of a request to ``url`` (an engine URL plus its /v1/... path)."""
        timeout = self._request_timeouts.get(url)
        if timeout is None:
            cut = url.rfind("/v1/")
            timeout = self._engine_timeouts.get(url[:cut] if cut >= 0 else url, self.default_timeout)
            if len(self._request_timeouts) < 4096:  # engines x endpoints: bounded, but bound it anyway
                self._request_timeouts[url] = timeout
        return timeout

    async def post(self, url: str, payload: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """Send one request, under its engine's read timeout; the response's headers are read, its body is not."""
        return await self.session.post(url, data=payload, headers=headers, timeout=self.timeout_for(url))

    async def get(self, url: str, timeout_s: float) -> bytes:
        """GET a small document (health, model list) on the probe session; an HTTP error status raises."""
        async with self.probes.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            resp.raise_for_status()
            return await resp.read()

    async def aclose(self) -> None:
        for session in (self._session, self._probes):
            if session is not None and not session.closed:
                await session.close()
        self._session = self._probes = None
