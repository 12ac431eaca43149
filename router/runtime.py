"""The router's live state: routing table, replicas, telemetry, and the loops that keep them fresh."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import anyio

from polyspec.core.langid import LabelSet, allowed_labels
from polyspec.router.backends import Backends
from polyspec.router.capture import PromptCapture
from polyspec.router.config import RouterConfig
from polyspec.router.table import RegistrySource, RoutingTable, TableSource, build_table
from polyspec.router.telemetry import Telemetry

log = logging.getLogger("polyspec.router")


class RouterRuntime:
    def __init__(self, config: RouterConfig, source: TableSource | None = None) -> None:
        self.config = config
        self.source: TableSource = source if source is not None else RegistrySource(config.registry_url)
        self.default_language = config.resolved_default_language()
        self.table = RoutingTable(pools=[], default_language=self.default_language)
        self.backends = Backends(config)
        self.telemetry = Telemetry(config.router_id)
        self.capture = PromptCapture(config.resolved_capture_dir(), config.router_id) if config.capture else None
        self.last_refresh: float | None = None
        self.last_refresh_error: str | None = None
        self._refresh_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # --- registry sync -------------------------------------------------------------------------
    async def refresh(self) -> dict[str, Any]:
        """Reload the routing table and shared live stats from the source (the admin refresh calls this).

        On failure the router keeps its last table and reports the error.
        """
        async with self._refresh_lock:
            try:
                deployments = await anyio.to_thread.run_sync(self.source.deployments)
                table = build_table(deployments, self.default_language)
            except Exception as exc:  # any registry failure: keep serving from the last table
                self.last_refresh_error = f"{type(exc).__name__}: {exc}"
                log.warning("routing table refresh failed, keeping the last one: %s", self.last_refresh_error)
                return {"ok": False, "error": self.last_refresh_error, "pools": len(self.table.pools)}
            known = set(self.backends.replicas)
            self.table = table
            self.backends.sync([(r.name, r.url) for r in table.replicas()])
            new = [s for url, s in self.backends.replicas.items() if url not in known]
            await asyncio.gather(*(self.backends.probe(s) for s in new))
            self.last_refresh, self.last_refresh_error = time.time(), None
            await self._load_shared_stats()
            return {"ok": True, "pools": len(table.pools), "replicas": len(self.backends.replicas)}

    async def _load_shared_stats(self) -> None:
        try:
            rows = await anyio.to_thread.run_sync(self.source.live_stats)
        except Exception as exc:
            log.warning("could not read live stats: %s", exc)
            return
        from polyspec.router.telemetry import merge_rows

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
        from polyspec.core.langid import detect

        await anyio.to_thread.run_sync(detect, "warm up")  # loads fastText now, not on the first request
        await self.refresh()
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
        await self.flush()
        await self.backends.aclose()

    # --- views ---------------------------------------------------------------------------------
    def known_models(self) -> list[str]:
        return sorted(set(self.config.model_aliases) | self.backends.model_ids())

    def langid_labels(self, table: RoutingTable) -> LabelSet:
        """The languages langid may choose from for ``table``: the ones it serves and the default."""
        labels = table.cached("langid_labels")
        if labels is None:
            labels = table.cache("langid_labels", allowed_labels(table.languages | {self.default_language}))
        return labels

    def ready(self) -> bool:
        return any(self.backends.is_healthy(r.url) for r in self.table.replicas())

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
        for state in self.backends.replicas.values():
            m.backend_up.labels(state.name).set(1 if state.healthy else 0)
            m.in_flight.labels(state.name).set(state.in_flight)
