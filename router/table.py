"""The routing table: pools of engine replicas built from the registry's active deployments.

Deployments that share draft, languages and domain form one pool; each deployment URL is a replica.
Sources are pluggable so that the app can be built before (or without) a registry: a source only has
to return deployment-like objects (attributes of ``registry.DeploymentView``) and, optionally, store
and return live stats.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.engine import make_url

from polyspec.core.counters import SpecCounts
from polyspec.core.speed import shared_curves

NO_DRAFT = "none"
_CACHE_LIMIT = 4096


@dataclass(frozen=True)
class Replica:
    name: str  # deployment name, reported in X-Polyspec-Backend
    url: str  # engine base URL, without /v1


@dataclass
class Pool:
    draft: str
    languages: tuple[str, ...]
    domain: str
    is_default: bool
    offline_mal: dict[str, float]
    replicas: list[Replica] = field(default_factory=list)
    # The speed model's inputs (core.speed): drafted tokens per step (0: no speculation), offline
    # per-position acceptance and its prompts per language, and batch size -> calibrated step seconds
    # (the mean over the engines of its replicas' shapes).
    k: int = 0
    offline_acceptance: dict[str, tuple[float, ...]] = field(default_factory=dict)
    offline_samples: dict[str, int] = field(default_factory=dict)
    step_s: dict[int, float] = field(default_factory=dict)
    # Every engine URL of the shapes of this pool's replicas (build_table): live step times are read over them.
    step_urls: tuple[str, ...] = ()

    @property
    def speculates(self) -> bool:
        return self.draft != NO_DRAFT

    @cached_property
    def key(self) -> str:  # cached: the policy reads it several times per request; its parts never change
        return f"{self.draft}|{','.join(self.languages)}|{self.domain}"

    def serves(self, language: str) -> bool:
        return language in self.languages


@dataclass
class RoutingTable:
    """Built once per refresh and not changed afterwards: the lookups below are cached on that basis."""

    pools: list[Pool]
    default_language: str
    built_at: float = field(default_factory=time.time)
    _cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def languages(self) -> set[str]:
        served = self._cache.get("languages")
        if served is None:
            served = self._cache["languages"] = {lang for pool in self.pools for lang in pool.languages}
        return served | {self.default_language}

    @property
    def known_languages(self) -> set[str]:
        """The served languages plus every language some pool's draft has an offline figure for: the speed
        policy can predict (and serve, through a pool without speculation) those too, so it identifies them
        rather than folding them into the nearest served language."""
        known = self._cache.get("known_languages")
        if known is None:
            evaluated = {lang for pool in self.pools for lang in pool.offline_acceptance}
            known = self._cache["known_languages"] = self.languages | evaluated
        return known

    def cached(self, key: str) -> Any:
        """A value derived from this table and kept with it (None if not computed yet)."""
        return self._cache.get(key)

    def cache(self, key: str, value: Any) -> Any:
        self._cache[key] = value
        return value

    def pools_for(self, language: str, domain: str) -> list[Pool]:
        key = ("pools_for", language, domain)
        pools = self._cache.get(key)
        if pools is None:
            pools = [p for p in self.pools if p.serves(language) and p.domain == domain]
            if len(self._cache) < _CACHE_LIMIT:  # pinned languages come from clients: bound the cache
                self._cache[key] = pools
        return list(pools)

    def default_pools(self) -> list[Pool]:
        pools = self._cache.get("default")
        if pools is None:
            marked = [p for p in self.pools if p.is_default]
            pools = self._cache["default"] = marked or self.pools_for(self.default_language, "general")
        return list(pools)

    def replicas(self) -> list[Replica]:
        seen: dict[str, Replica] = {}
        for pool in self.pools:
            for replica in pool.replicas:
                seen.setdefault(replica.url, replica)
        return list(seen.values())

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "pool": p.key,
                "draft": p.draft,
                "languages": list(p.languages),
                "domain": p.domain,
                "is_default": p.is_default,
                "offline_mal": dict(p.offline_mal),
                "k": p.k,
                "step_s": {str(b): s for b, s in sorted(p.step_s.items())},
                "step_engines": len(p.step_urls),
                "replicas": [{"name": r.name, "url": r.url} for r in p.replicas],
            }
            for p in self.pools
        ]


@dataclass(frozen=True)
class LiveRow:
    """Live-acceptance counters (:class:`SpecCounts`) for one (language, domain, draft).

    Reads of the counters and of the derived figures (``acceptance``, ``mean_acceptance_length``) go to
    ``counts``: there is one counter type, and one place that derives figures from it.
    """

    language: str
    domain: str
    draft: str
    counts: SpecCounts = SpecCounts()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.language, self.domain, self.draft)

    def __getattr__(self, name: str) -> Any:
        # Only called for names the dataclass lacks: requests, num_spec_steps, acceptance, ...
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.counts, name)


class TableSource(Protocol):
    """Where the router gets deployments and shares live stats (the registry in production)."""

    def deployments(self) -> Sequence[Any]: ...

    def live_stats(self) -> Sequence[LiveRow]: ...

    def record_live_stats(self, router_id: str, rows: Sequence[LiveRow]) -> None: ...


def field_of(obj: Any, name: str, default: Any = None) -> Any:
    """A field of a deployment or live-stat row given as a record or as a dict (a fleet YAML, a test)."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _draft_name(obj: Any) -> str:
    draft = field_of(obj, "draft")
    if draft is None:
        return NO_DRAFT
    if isinstance(draft, str):
        return draft
    # A nested draft view: prefer "name:version" when a version is there.
    name = field_of(draft, "name", str(draft))
    version = field_of(draft, "version")
    return f"{name}:{version}" if version is not None else str(name)


def build_table(deployments: Iterable[Any], default_language: str) -> RoutingTable:
    """Group deployments into pools. Deployments without a URL are not routable yet and are skipped.

    A pool's step times are those of its replicas' engine shapes (``step_shape``, core.speed.shared_curves):
    the calibrated curve is the mean over every engine of those shapes, and ``step_urls`` names them all, so
    that live step times are pooled the same way. Deployments without a shape keep their own."""
    pools: dict[tuple[str, tuple[str, ...], str], Pool] = {}
    routable: list[tuple[tuple[str, tuple[str, ...], str], str | None, str, dict[int, float]]] = []
    for dep in deployments:
        url = field_of(dep, "url")
        if not url:
            continue
        languages = tuple(sorted(field_of(dep, "languages") or ()))
        domain = field_of(dep, "domain") or "general"
        draft = _draft_name(dep)
        key = (draft, languages, domain)
        pool = pools.get(key)
        if pool is None:
            offline = field_of(dep, "offline_mal") or {}
            pool = Pool(draft, languages, domain, bool(field_of(dep, "is_default")), {k: float(v) for k, v in offline.items() if v is not None})
            pool.k = int(field_of(dep, "k") or 0) if draft != NO_DRAFT else 0
            pool.offline_acceptance = {lang: tuple(float(a) for a in rates)
                                       for lang, rates in (field_of(dep, "offline_acceptance") or {}).items()}
            pool.offline_samples = {lang: int(n) for lang, n in (field_of(dep, "offline_samples") or {}).items()}
            pools[key] = pool
        pool.is_default = pool.is_default or bool(field_of(dep, "is_default"))
        replica = Replica(name=str(field_of(dep, "name")), url=str(url).rstrip("/"))
        pool.replicas.append(replica)
        curve = {int(b): float(s) for b, s in (field_of(dep, "step_s") or {}).items()}
        routable.append((key, field_of(dep, "step_shape"), replica.url, curve))
    shared = shared_curves({str(i): (shape, curve) for i, (_, shape, _, curve) in enumerate(routable)})
    points: dict[tuple[str, tuple[str, ...], str], dict[int, list[float]]] = {}
    shapes: dict[tuple[str, tuple[str, ...], str], set[str]] = {}
    for i, (key, shape, url, _) in enumerate(routable):
        for batch, seconds in shared[str(i)].items():
            points.setdefault(key, {}).setdefault(batch, []).append(seconds)
        shapes.setdefault(key, set()).add(shape or url)
    for key, pool in pools.items():
        pool.step_s = {batch: sum(v) / len(v) for batch, v in sorted(points.get(key, {}).items())}
        pool.step_urls = tuple(dict.fromkeys(url for _, shape, url, _ in routable if (shape or url) in shapes[key]))
    return RoutingTable(pools=sorted(pools.values(), key=lambda p: p.key), default_language=default_language)


class RegistrySource:
    """The production source: ``registry.open_registry(url, create=False)``; opened lazily, reopened after errors.

    The router never creates a registry: a missing one raises `RegistryMissing` (the router then keeps its
    last table and reports it) until `polyspec registry init` or `polyspec up` makes one. A SQLite file is
    also watched by identity: an open connection goes on reading, and writing, a file that was deleted or
    replaced. So once opened, a missing file is `RegistryMissing` too (never re-created empty) and a
    replaced one (a restored backup) is reopened.

    The refresh and the stats flush call it from two worker threads: opening and dropping are serialised.
    """

    def __init__(self, url: str | None = None) -> None:
        self._url = url
        self._registry: Any = None
        self._file: RegistryFile | None = None
        self._lock = threading.Lock()
        # Calls in flight per open registry. A registry dropped while the other thread still runs a query on
        # it is closed by the last call to finish, never under it: closing a SQLite connection in use from
        # another thread crashed the process (a segfault in the CI replica of 2026-12-03, registry locked).
        self._users: dict[int, int] = {}
        self._retired: dict[int, Any] = {}

    def _reg(self) -> Any:
        """The open registry, counted as in use until `_release` (opened on first use)."""
        with self._lock:
            registry = self._reg_locked()
            self._users[id(registry)] = self._users.get(id(registry), 0) + 1
            return registry

    def _release(self, registry: Any) -> None:
        with self._lock:
            left = self._users.pop(id(registry)) - 1
            if left:
                self._users[id(registry)] = left
                return
            retired = self._retired.pop(id(registry), None)
        if retired is not None:
            with contextlib.suppress(Exception):
                retired.close()

    def _reg_locked(self) -> Any:
        """The open registry, opening it when needed; the caller holds ``self._lock``."""
        if self._file is not None:
            status = self._file.status()
            if status == "missing":
                self._drop_locked()
                from polyspec.registry import RegistryMissing

                raise RegistryMissing(f"registry database {self._file.path} is missing (deleted or moved); "
                                      "restore it, or create one with `polyspec registry init`")
            if status == "replaced":
                self._drop_locked()  # e.g. restored from a backup: read the new file
        if self._registry is None:
            from polyspec.registry import open_registry

            self._registry = open_registry(self._url, create=False)
            self._file = RegistryFile.of(self._url)
        return self._registry

    def _drop_locked(self) -> None:
        # ``_file`` stays: a deleted file keeps being reported as deleted, a restored one is reopened.
        registry, self._registry = self._registry, None
        if registry is None:
            return
        if self._users.get(id(registry)):
            self._retired[id(registry)] = registry  # closed by its last call (`_release`)
            return
        with contextlib.suppress(Exception):
            registry.close()

    def _call(self, method: str, *args: Any) -> Any:
        registry = self._reg()
        try:
            return getattr(registry, method)(*args)
        except Exception:
            with self._lock:
                if self._registry is registry:
                    self._drop_locked()  # reconnect next time (e.g. Postgres restarted)
            raise
        finally:
            self._release(registry)

    def deployments(self) -> Sequence[Any]:
        return self._call("active_deployments")

    def live_stats(self) -> Sequence[LiveRow]:
        return [to_live_row(row) for row in self._call("live_stats")]

    def record_live_stats(self, router_id: str, rows: Sequence[LiveRow]) -> None:
        self._call("record_live_stats", router_id, [live_row_dict(r) for r in rows])


def _sqlite_path(url: str | None) -> Path | None:
    """The SQLite file behind a registry URL, None for anything else. Read from the URL, not from the
    opened engine: a registry opened without create connects through a ``file:...?mode=rw`` URI."""
    if url is None:
        from polyspec.core.settings import get_settings

        url = get_settings().resolved_registry_url
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or parsed.query.get("uri"):
        return None  # a "file:...?uri=true" name is not a path: not watched
    return Path(database).expanduser()


@dataclass(frozen=True)
class RegistryFile:
    """The SQLite file behind a registry URL, as it was when the registry was opened: an open connection
    goes on reading (and writing) a file that was deleted or replaced, so readers check it before reading."""

    path: Path
    identity: tuple[int, int]  # (st_dev, st_ino)

    @classmethod
    def of(cls, url: str | None) -> RegistryFile | None:
        """None for a registry that is not a SQLite file path, or whose file cannot be read now."""
        path = _sqlite_path(url)
        if path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return cls(path, (st.st_dev, st.st_ino))

    def status(self) -> str:
        """"same", "missing" (deleted or moved) or "replaced" (another file at the path, e.g. a restored
        backup). Another error of the file system is raised."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return "missing"
        return "same" if (st.st_dev, st.st_ino) == self.identity else "replaced"


def live_row_dict(row: LiveRow) -> dict[str, Any]:
    c = row.counts
    return {
        "language": row.language,
        "domain": row.domain,
        "draft_name": row.draft,
        "requests": c.requests,
        "completion_tokens": c.completion_tokens,
        "num_spec_steps": c.num_spec_steps,
        "num_draft_tokens": c.num_draft_tokens,
        "num_accepted_tokens": c.num_accepted_tokens,
        "accepted_per_pos": list(c.accepted_per_pos),
        "generation_s": c.generation_s,
    }


def to_live_row(row: Any) -> LiveRow:
    counts = SpecCounts(
        requests=int(field_of(row, "requests", 0) or 0),
        completion_tokens=int(field_of(row, "completion_tokens", 0) or 0),
        num_spec_steps=int(field_of(row, "num_spec_steps", 0) or 0),
        num_draft_tokens=int(field_of(row, "num_draft_tokens", 0) or 0),
        num_accepted_tokens=int(field_of(row, "num_accepted_tokens", 0) or 0),
        accepted_per_pos=tuple(int(x) for x in (field_of(row, "accepted_per_pos") or ())),
        generation_s=float(field_of(row, "generation_s", 0.0) or 0.0),
    )
    return LiveRow(
        language=field_of(row, "language"),
        domain=field_of(row, "domain") or "general",
        draft=field_of(row, "draft_name") or field_of(row, "draft") or NO_DRAFT,
        counts=counts,
    )
