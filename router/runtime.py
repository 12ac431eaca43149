"""The router's live state: routing table, replicas, telemetry, and the loops that keep them fresh."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import anyio

from polyspec.core import hugepages
from polyspec.core.langid import LabelSet, warm_up
from polyspec.registry.errors import RegistryMissing
from polyspec.router.engine.backends import Backends
from polyspec.router.capture import PromptCapture
from polyspec.router.config import RouterConfig
from polyspec.router.decision.speed import Explorer, LiveSteps, SpeedInputs
from polyspec.router.decision.canary import canaries_of
from polyspec.router.source import RegistrySource, TableSource
from polyspec.router.table import RoutingTable, build_table
from polyspec.router.telemetry import Telemetry, merge_rows

log = logging.getLogger("polyspec.router")

REFRESH_WAIT_MAX_S = 10.0  # longest a caller waits for a refresh; a slower one goes on in the background
START_REFRESH_WAIT_S = 30.0  # at start: the first table is worth waiting for, a hung registry is not


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved; the callers that waited saw it


def _utc(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


class RouterRuntime:
    def __init__(self, config: RouterConfig, source: TableSource | None = None) -> None:
        self.config = config
        self.source: TableSource = source if source is not None else RegistrySource(config.registry_url)
        self.default_language = config.resolved_default_language()
        self.table = RoutingTable(pools=(), default_language=self.default_language)
        self.backends = Backends(config)
        self.telemetry = Telemetry(config.router_id)
        self.live_steps = LiveSteps()  # step times measured on each replica (router.decision.speed)
        self.explorer = Explorer(config.explore_share)
        self.speed_inputs: SpeedInputs | None = None  # built by router.decision.routing.speed_inputs
        self.capture = PromptCapture.from_config(config, metrics=self.telemetry.metrics) if config.capture else None
        self.last_refresh: float | None = None
        self.last_refresh_error: str | None = None
        self.registry_problem: str | None = None  # a lost or emptied registry: not ready, with this reason
        self.draining = False  # SIGTERM came: not ready, in-flight requests finish (router.edge.server)
        self.drain_expired = False  # the drain grace is over: open streams end with an error event
        self._refresh_task: asyncio.Task[dict[str, Any]] | None = None
        self._refresh_late = False
        self.table_stale = False
        self._tasks: list[asyncio.Task[None]] = []

    # --- registry sync -------------------------------------------------------------------------
    async def refresh(self, wait_s: float | None = None) -> dict[str, Any]:
        """Reload the routing table and shared live stats from the source (the admin refresh calls this).

        One refresh runs at a time, in a worker thread: callers that come while one runs (the timer, the
        admin button) wait for that same one, never start another, so a hung registry (a held SQLite lock,
        a stalled Postgres) cannot pile refreshes up. A caller waits ``wait_s`` at most (default: one
        refresh period, at most REFRESH_WAIT_MAX_S); the refresh itself goes on and applies its result
        when it ends. On failure the router keeps its last table and reports the error.
        """
        task = self._refresh_task
        if task is None or task.done():
            task = self._refresh_task = asyncio.create_task(self._refresh())
            task.add_done_callback(_retrieve)  # its callers may all have stopped waiting
            self._refresh_late = False
        if wait_s is None:
            wait_s = min(self.config.refresh_interval_s, REFRESH_WAIT_MAX_S)
        try:
            return await asyncio.wait_for(asyncio.shield(task), wait_s)
        except TimeoutError:
            error = f"the registry did not answer within {wait_s:g} s; the refresh goes on in the background"
            if not self._refresh_late:  # one count and one log line per hung refresh, not per caller
                self._refresh_late = True
                self.telemetry.metrics.refresh_failures.labels("timeout").inc()
                log.error("routing table refresh is late: %s (no other refresh starts until it ends)", error)
            return {"ok": False, "error": error, "pools": len(self.table.pools)}

    async def _refresh(self) -> dict[str, Any]:
        try:
            # abandon_on_cancel: stop() does not wait for a hung read (its thread ends on its own).
            deployments = await anyio.to_thread.run_sync(self.source.deployments, abandon_on_cancel=True)
            # `polyspec adapt` canaries: router.decision.canary
            table = build_table(deployments, self.default_language, canaries_of(deployments))
        except Exception as exc:  # any registry failure: keep serving from the last table
            return self._refresh_failed(exc)
        if table.routes_as(self.table):
            table = self.table  # the registry did not change: the table, and what it has memoised, stay
        if not table.pools and self.table.pools:
            return self._refuse_empty()
        # lingua's models and the word tables for the new table's languages load in a worker thread before the
        # table serves:
        # otherwise the first short prompt of each language would load them on the event loop (0.8 s, GIL held).

        await anyio.to_thread.run_sync(warm_up, self.langid_labels(table))
        known = set(self.backends.replicas)
        self.table = table
        self.backends.sync([(r.name, r.url) for r in table.replicas()])
        new = [s for url, s in self.backends.replicas.items() if url not in known]
        await asyncio.gather(*(self.backends.probe(s) for s in new))
        if self.registry_problem is not None:
            log.warning("registry back: routing table of %d pools loaded", len(table.pools))
        self.last_refresh, self.last_refresh_error, self.registry_problem = time.time(), None, None
        self._set_stale(False)
        await self._load_shared_stats()
        return {"ok": True, "pools": len(table.pools), "replicas": len(self.backends.replicas)}

    def _set_stale(self, stale: bool) -> None:
        """Stale: the router routes with a table the registry did not confirm at the last refresh."""
        self.table_stale = stale
        self.telemetry.metrics.table_stale.set(1 if stale else 0)

    def _set_problem(self, problem: str, what: str) -> None:
        """Not ready because of the registry. Logged once per new problem, not at every refresh: the
        metric counts the refreshes, /ready keeps the reason."""
        if problem != self.registry_problem:
            log.error("%s: %s", what, problem)
        self.registry_problem = problem

    def _last_good(self) -> str:
        when = self.last_refresh or self.table.built_at
        return f"the last good table of {len(self.table.pools)} pools from {_utc(when)}"

    def _refresh_failed(self, exc: Exception) -> dict[str, Any]:
        """A registry that cannot be read. A missing one makes the router not ready (an operator must act);
        another error (a lock, a restarting database) is reported and retried at the next refresh."""
        self.last_refresh_error = f"{type(exc).__name__}: {exc}"
        missing = isinstance(exc, RegistryMissing)
        self.telemetry.metrics.refresh_failures.labels("missing" if missing else "error").inc()
        self._set_stale(bool(self.table.pools))
        if missing:
            self._set_problem(str(exc) + (f"; serving {self._last_good()}" if self.table.pools else ""),
                              "routing table refresh failed")
        else:
            log.warning("routing table refresh failed, keeping the last one: %s", self.last_refresh_error)
        return {"ok": False, "error": self.last_refresh_error, "pools": len(self.table.pools)}

    def _refuse_empty(self) -> dict[str, Any]:
        """A registry that suddenly lists no active deployment is far more often a lost or wrong registry
        than an intent to serve nothing: keep routing with the last good table and say so."""
        self._set_problem(f"registry returned no active deployments; serving {self._last_good()}",
                          "routing table refresh refused")
        self.last_refresh_error = self.registry_problem
        self.telemetry.metrics.refresh_failures.labels("empty").inc()
        self._set_stale(True)
        return {"ok": False, "error": self.registry_problem, "pools": len(self.table.pools)}

    async def _load_shared_stats(self) -> None:
        try:
            rows = await anyio.to_thread.run_sync(self.source.live_stats, abandon_on_cancel=True)
        except Exception as exc:
            log.warning("could not read live stats: %s", exc)
            return

        self.telemetry.set_shared(merge_rows(rows))

    async def flush(self) -> bool:
        """Persist pending acceptance deltas; on failure they wait for the next flush."""
        rows = self.telemetry.take_pending()
        if not rows:
            return True
        try:
            await anyio.to_thread.run_sync(self.source.record_live_stats, self.config.router_id, rows)
        except Exception as exc:
            self.telemetry.restore_pending(rows)
            log.warning("could not persist live stats (kept for the next flush): %s", exc)
            return False
        self.telemetry.flushed_at = time.time()
        await self._load_shared_stats()
        return True

    # --- background loops ----------------------------------------------------------------------
    async def _every(self, seconds: float, action: Any) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await action()
            except Exception:  # a loop must survive anything one round throws
                log.exception("background task failed")

    async def start(self) -> None:
        await anyio.to_thread.run_sync(warm_up)  # loads fastText now, not on the first request
        await self.refresh(wait_s=START_REFRESH_WAIT_S)
        if self.config.huge_pages:  # the models are in memory now (the refresh loaded lingua's for the table)
            pages = await anyio.to_thread.run_sync(hugepages.advise)
            log.info("huge pages: %s", pages)
        if self.capture is not None:
            self.capture.start()  # its writer task: capture never runs on the request path
        self._tasks = [
            asyncio.create_task(self._every(self.config.health_interval_s, self.backends.probe_all)),
            asyncio.create_task(self._every(self.config.refresh_interval_s, self.refresh)),
            asyncio.create_task(self._every(self.config.flush_interval_s, self.flush)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._refresh_task is not None:
            self._refresh_task.cancel()  # a hung read is abandoned: the stats flush below still runs
        if self.capture is not None:
            await self.capture.stop()
        await self.flush()  # a write is never abandoned: it ends when the registry answers or times out
        await self.backends.aclose()

    # --- views ---------------------------------------------------------------------------------
    def known_models(self) -> list[str]:
        return sorted(set(self.config.model_aliases) | self.backends.model_ids())

    def langid_labels(self, table: RoutingTable) -> LabelSet:
        """The languages langid may choose from for ``table``: its ``known_languages`` (RoutingTable)."""
        return table.langid_labels

    def not_ready_reason(self) -> str | None:
        """Why /ready answers 503, in words an operator can act on; None when ready."""
        if self.draining:
            return "draining: the router is shutting down"
        if self.registry_problem is not None:
            return self.registry_problem
        if not self.table.pools:
            if self.last_refresh_error is not None:
                return f"no routing table yet: {self.last_refresh_error}"
            return "no active deployments in the registry"
        if not any(self.backends.is_healthy(r.url) for r in self.table.replicas()):
            return "no healthy engine replica"
        return None

    def ready(self) -> bool:
        return self.not_ready_reason() is None

    def readiness(self) -> dict[str, Any]:
        """The body of /ready: ``ready`` and, when not, ``reason`` in words an operator can act on."""
        reason = self.not_ready_reason()
        self.telemetry.metrics.ready.set(1 if reason is None else 0)
        return {"ready": reason is None, "reason": reason,
                "pools": len(self.table.pools),
                "healthy_replicas": sum(1 for s in self.backends.replicas.values() if s.healthy),
                "last_refresh_error": self.last_refresh_error,
                "table_stale": self.table_stale,
                "draining": self.draining}

    def snapshot(self) -> dict[str, Any]:
        snap = self.telemetry.snapshot_dict(self.table, self.backends)
        snap.update(
            default_language=self.default_language,
            last_refresh=self.last_refresh,
            last_refresh_error=self.last_refresh_error,
            ready=self.ready(),
        )
        return snap

    def update_gauges(self) -> None:
        m = self.telemetry.metrics
        m.ready.set(1 if self.ready() else 0)
        m.draining.set(1 if self.draining else 0)
        for state in self.backends.replicas.values():
            m.backend_up.labels(state.name).set(1 if state.healthy else 0)
            m.in_flight.labels(state.name).set(state.in_flight)
