"""Adapts a running router app (``app.state.runtime``) and the registry to what the dashboard reads.

Telemetry comes from ``router.telemetry.snapshot(app)``; drafts, evaluations and language profiles
from ``registry.open_registry()``. A registry that cannot be read does not break the dashboard: the
telemetry still shows and the error is reported in the summary.
"""

from __future__ import annotations

import threading
from typing import Any

from polyspec.router.admin.summary import BackendStatus, RegistryData
from polyspec.router.table import LiveRow, to_live_row

_registries: dict[str | None, Any] = {}
_lock = threading.Lock()


def _registry(url: str | None) -> Any:
    # One Registry (one SQLAlchemy engine pool) per URL for the life of the process.
    with _lock:
        if url not in _registries:
            from polyspec.registry import open_registry

            _registries[url] = open_registry(url)
        return _registries[url]


def read_registry(url: str | None) -> RegistryData:
    try:
        reg = _registry(url)
        return RegistryData(drafts=reg.drafts(), evaluations=reg.evaluations(), profiles=reg.languages())
    except Exception as exc:  # shown on the page; telemetry stays useful without the registry
        with _lock:
            _registries.pop(url, None)
        return RegistryData(error=f"{type(exc).__name__}: {exc}")


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
        drafts = sorted({p.get("draft") for p in pools if p.get("draft")})
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

    def backend_statuses(self) -> list[BackendStatus]:
        return backend_statuses(self.snapshot())

    def registry_data(self) -> RegistryData:
        return read_registry(self.registry_url)

    async def refresh(self) -> dict[str, Any]:
        result = await self.runtime.refresh()
        if not result.get("ok", True):
            raise RuntimeError(result.get("error") or "refresh failed")
        return {**result, "backends": result.get("replicas", 0)}
