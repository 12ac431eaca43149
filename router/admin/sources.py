"""Adapts a running router app (``app.state.runtime``) and the registry to what the dashboard reads.

Telemetry comes from ``router.telemetry.snapshot(app)``; drafts, evaluations and language profiles
from ``registry.open_registry(url, create=False)``: the dashboard never makes a registry appear, a
missing one is reported in the summary instead. A registry that cannot be read does not break the
dashboard: the telemetry still shows and the error is reported in the summary.

A registry can also hang (a SQLite file locked by another process waits out its 30 s busy timeout, a
stalled Postgres waits forever). Registry reads therefore run in their own daemon thread, at most one per
registry URL at a time: polls that come while one is running share its result instead of starting another,
and a caller waits a bounded time (``read_registry_within``). No lock is ever held while the registry is
touched, so one hung registry holds up nothing but its own reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future
from typing import Any

from polyspec.router.admin.summary import BackendStatus, RegistryData
from polyspec.router.source import RegistryFile
from polyspec.router.table import LiveRow, to_live_row

THREAD_NAME = "polyspec-admin-registry"


class _Opened:
    """One Registry (one SQLAlchemy engine pool) per URL, with its SQLite file if it has one (`RegistryFile`)."""

    def __init__(self, registry: Any, url: str | None) -> None:
        self.registry = registry
        self.file = RegistryFile.of(url)

    def current(self) -> bool:
        return self.file is None or self.file.status() == "same"


_registries: dict[str | None, _Opened] = {}
_reads: dict[str | None, Future[RegistryData]] = {}
# Guards the two dicts above, for a few instructions at a time: never held while the registry is opened or
# read (a hung open under it would hold every admin request of every router in the process).
_lock = threading.Lock()


def _drop(url: str | None) -> None:
    with _lock:
        opened = _registries.pop(url, None)
    if opened is not None:
        with contextlib.suppress(Exception):
            opened.registry.close()


def _registry(url: str | None) -> Any:
    # Only the one read thread of this URL gets here (see start_read), so opens of one URL never race.
    with _lock:
        opened = _registries.get(url)
    if opened is not None and not opened.current():
        _drop(url)  # deleted (then missing) or replaced (a restored backup: read the new file)
        opened = None
    if opened is None:
        from polyspec.registry import open_registry

        opened = _Opened(open_registry(url, create=False), url)
        with _lock:
            _registries[url] = opened
    return opened.registry


TIMELINE_EVENTS = 200  # newest `polyspec adapt` events on the dashboard (`polyspec adapt history` has them all)


def read_registry(url: str | None) -> RegistryData:
    """The dashboard's registry records, read now in this thread; a failure is returned, never raised."""
    try:
        reg = _registry(url)
        return RegistryData(drafts=reg.drafts(), evaluations=reg.evaluations(), profiles=reg.languages(),
                            adaptation=reg.adaptation_events(limit=TIMELINE_EVENTS))
    except Exception as exc:  # shown on the page; telemetry stays useful without the registry
        _drop(url)  # reconnect next time (a restarted Postgres, a restored file)
        return RegistryData(error=f"{type(exc).__name__}: {exc}")


def start_read(url: str | None) -> Future[RegistryData]:
    """The registry read of ``url`` in flight, or a new one in a daemon thread (a hung read never holds up
    the process' exit)."""
    with _lock:
        running = _reads.get(url)
        if running is not None and not running.done():
            return running
        future: Future[RegistryData] = Future()
        _reads[url] = future

    def run() -> None:
        try:
            future.set_result(read_registry(url))
        except BaseException as exc:  # noqa: BLE001 - whatever ends the read ends it for every waiter
            future.set_exception(exc)

    threading.Thread(target=run, name=THREAD_NAME, daemon=True).start()
    return future


async def read_registry_within(url: str | None, timeout_s: float) -> RegistryData:
    """The registry records, or after ``timeout_s`` an error saying the registry did not answer (the read
    goes on, and the next poll takes its result or starts a fresh one once it is over)."""
    future = start_read(url)
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not waiter.done():
            waiter.set_result(None)

    def wake(_: Future[RegistryData]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(settle)

    future.add_done_callback(wake)
    try:
        await asyncio.wait_for(waiter, timeout_s)
    except TimeoutError:
        return RegistryData(error=f"registry did not answer within {timeout_s:g} s")
    return future.result()


def live_counters(snapshot: dict[str, Any]) -> list[LiveRow]:
    return [to_live_row(a) for a in snapshot.get("aggregates", [])]


def backend_statuses(snapshot: dict[str, Any]) -> list[BackendStatus]:
    """Replica health joined with the routing table's pools (languages, draft, default flag)."""
    pools_by_url: dict[str, list[dict[str, Any]]] = {}
    for pool in snapshot.get("routing_table", []):
        for rep in pool.get("replicas", []):
            pools_by_url.setdefault(rep["url"], []).append(pool)
    out = []
    for b in snapshot.get("backends", []):
        pools = pools_by_url.get(b["url"], [])
        languages = sorted({lang for p in pools for lang in p.get("languages", [])})
        drafts = sorted({str(p["draft"]) for p in pools if p.get("draft")})
        detail = b.get("last_error") or (f"in flight: {b.get('in_flight', 0)}")
        out.append(BackendStatus(
            name=b["name"], url=b["url"], healthy=bool(b.get("healthy")), languages=tuple(languages),
            domain=(pools[0].get("domain") if pools else "general") or "general",
            draft=", ".join(d for d in drafts) or None, is_default=any(p.get("is_default") for p in pools),
            detail=detail,
        ))
    return sorted(out, key=lambda s: s.name)


def traffic_by_language(snapshot: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in snapshot.get("traffic", []):
        out[row["language"]] = out.get(row["language"], 0) + int(row["requests"])
    return out


class AppSources:
    """AdminSources over a router app and its runtime (``app.state.runtime``). Build one per request: the telemetry
    snapshot is taken once and reused by every chart of that response."""

    def __init__(self, app: Any, runtime: Any | None = None) -> None:
        self.app = app
        self.runtime = runtime if runtime is not None else app.state.runtime
        self.router_id = self.runtime.config.router_id
        self.threshold = self.runtime.config.language_threshold
        self.registry_url = self.runtime.config.registry_url
        self._snap: dict[str, Any] | None = None

    def snapshot(self) -> dict[str, Any]:
        if self._snap is None:
            from polyspec.router.telemetry import snapshot

            self._snap = snapshot(self.runtime)
        return self._snap

    def live_counters(self) -> list[LiveRow]:
        return live_counters(self.snapshot())

    def langid(self) -> tuple[list[float], list[int]]:
        hist = self.snapshot().get("langid_confidence") or {}
        uppers = [float(u) for u in hist.get("buckets", [])]
        return [0.0, *uppers], [int(c) for c in hist.get("counts", [])]

    def traffic(self) -> dict[str, int]:
        return traffic_by_language(self.snapshot())

    def predictions(self) -> dict[tuple[str, str], float]:
        return {(p["language"], p["draft"]): float(p["tps"]) for p in self.snapshot().get("predicted_tps", [])}

    def backend_statuses(self) -> list[BackendStatus]:
        return backend_statuses(self.snapshot())

    async def registry_data(self, timeout_s: float) -> RegistryData:
        return await read_registry_within(self.registry_url, timeout_s)

    async def refresh(self, timeout_s: float | None = None) -> dict[str, Any]:
        # The runtime runs one refresh at a time and bounds each caller's wait (a hung registry answers
        # "did not answer within N s" here while the refresh goes on in the background).
        result = await self.runtime.refresh(wait_s=timeout_s)
        if not result.get("ok", True):
            raise RuntimeError(result.get("error") or "refresh failed")
        return {**result, "backends": result.get("replicas", 0)}
