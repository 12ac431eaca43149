"""Engine replicas: the upstream client, in-flight counts, served models and health with hysteresis.

A replica is marked down after ``fail_threshold`` consecutive failures (health probes or requests that
could not reach it) and up again after ``recover_threshold`` consecutive successful probes, so one
lost packet does not flap the routing table.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

from polyspec.router.config import RouterConfig
from polyspec.router.engine.upstream import UPSTREAM_ERRORS, Upstream

# A probe also fails on an answer that is not vLLM's /v1/models shape.
PROBE_ERRORS: tuple[type[BaseException], ...] = (*UPSTREAM_ERRORS, ValueError, KeyError, TypeError, AttributeError)

log = logging.getLogger("polyspec.router")


@dataclass
class ReplicaState:
    url: str
    name: str
    healthy: bool = True  # optimistic until probes say otherwise: a fresh router can serve at once
    fails: int = 0
    successes: int = 0
    in_flight: int = 0
    model_ids: list[str] = field(default_factory=list)
    last_error: str | None = None
    last_check: float | None = None


class Backends:
    def __init__(self, config: RouterConfig, upstream: Upstream | None = None) -> None:
        self.config = config
        self.upstream = upstream or Upstream(config)
        self.replicas: dict[str, ReplicaState] = {}
        # model id -> URLs of the replicas serving it; rebuilt when a replica set or model list changes,
        # read on every request.
        self._serving: dict[str, frozenset[str]] = {}

    def sync(self, replicas: list[tuple[str, str]]) -> None:
        """Track exactly these (name, url) replicas, keeping state of the ones already known."""
        wanted = {url: name for name, url in replicas}
        for url in list(self.replicas):
            if url not in wanted:
                del self.replicas[url]
        for url, name in wanted.items():
            state = self.replicas.get(url)
            if state is None:
                self.replicas[url] = ReplicaState(url=url, name=name)
            else:
                state.name = name
        self._index_models()
        self.upstream.set_replicas(replicas)

    def _index_models(self) -> None:
        serving: dict[str, set[str]] = {}
        for state in self.replicas.values():
            for model in state.model_ids:
                serving.setdefault(model, set()).add(state.url)
        self._serving = {m: frozenset(urls) for m, urls in serving.items()}

    def is_healthy(self, url: str) -> bool:
        state = self.replicas.get(url)
        return bool(state and state.healthy)

    def in_flight(self, url: str) -> int:
        state = self.replicas.get(url)
        return state.in_flight if state else 0

    def model_ids(self) -> set[str]:
        return set(self._serving)

    def serving(self, model: str) -> frozenset[str]:
        """URLs of the replicas whose engine serves ``model`` (empty when none does)."""
        return self._serving.get(model, frozenset())

    def model_for(self, url: str) -> str | None:
        state = self.replicas.get(url)
        return state.model_ids[0] if state and state.model_ids else None

    def acquire(self, url: str) -> None:
        if url in self.replicas:
            self.replicas[url].in_flight += 1

    def release(self, url: str) -> None:
        state = self.replicas.get(url)
        if state and state.in_flight > 0:
            state.in_flight -= 1

    def record_failure(self, url: str, error: str) -> None:
        state = self.replicas.get(url)
        if state is None:
            return
        state.successes = 0
        state.fails += 1
        state.last_error = error
        if state.healthy and state.fails >= self.config.fail_threshold:
            state.healthy = False
            log.warning("replica %s (%s) marked down: %s", state.name, url, error)

    def record_success(self, url: str) -> None:
        state = self.replicas.get(url)
        if state is None:
            return
        state.fails = 0
        state.successes += 1
        if not state.healthy and state.successes >= self.config.recover_threshold:
            state.healthy = True
            state.last_error = None
            log.warning("replica %s (%s) marked up", state.name, url)

    async def probe(self, state: ReplicaState) -> None:
        """One health probe: vLLM's /health, then /v1/models to learn the served model id."""
        timeout = self.config.health_timeout_s
        state.last_check = time.time()
        try:
            await self.upstream.get(f"{state.url}/health", timeout)
            if not state.model_ids:
                models = json.loads(await self.upstream.get(f"{state.url}/v1/models", timeout))
                state.model_ids = [m["id"] for m in models.get("data", [])]
                self._index_models()
        except PROBE_ERRORS as exc:
            self.record_failure(state.url, f"health: {type(exc).__name__}: {exc}")
            return
        self.record_success(state.url)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(s) for s in list(self.replicas.values())))

    def describe(self) -> list[dict[str, object]]:
        return [
            {
                "name": s.name,
                "url": s.url,
                "healthy": s.healthy,
                "in_flight": s.in_flight,
                "consecutive_failures": s.fails,
                "models": list(s.model_ids),
                "last_error": s.last_error,
                "last_check": s.last_check,
            }
            for s in self.replicas.values()
        ]

    async def aclose(self) -> None:
        await self.upstream.aclose()
