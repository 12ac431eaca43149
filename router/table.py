"""The routing table: pools of engine replicas built from the registry's active deployments.

Deployments that share draft, languages and domain form one pool; each deployment URL is a replica.
Where deployments come from is pluggable (router.source), so that the app can be built before (or without)
a registry: a source only has to return deployment-like objects (attributes of ``registry.DeploymentView``)
and, optionally, store and return live stats (`LiveRow`, kept here).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from polyspec.core.counters import SpecCounts
from polyspec.core.domains import DOMAINS
from polyspec.core.langid import LabelSet, allowed_labels
from polyspec.core.speed import shared_curves

NO_DRAFT = "none"
GENERAL = "general"
MEMO_LIMIT = 4096  # entries of one TableMemo map: keyed by bounded labels, and bounded again here


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


class TableMemo:
    """Values computed on demand from one table (and the live counters) and kept with it, each map bounded
    by `MEMO_LIMIT`: the speed policy's tokens per step keyed by the live counts they depend on
    (router.decision.speed), and the pools covering a set of likely labels
    (router.decision.routing.unsure_pools). The table's own fields never change; a new table starts with an
    empty memo."""

    __slots__ = ("speed", "unsure")

    def __init__(self) -> None:
        self.speed: dict[tuple[str, str, str, int, int], tuple[float, float, float]] = {}
        self.unsure: dict[tuple[tuple[str, ...], str], tuple[Pool, ...]] = {}


@dataclass(frozen=True, eq=False)
class RoutingTable:
    """Built once per registry change and never changed: every lookup the hot path makes of it is derived
    here, once, so a request reads fields instead of rebuilding sets per call (a refresh that finds the
    registry unchanged keeps the table it has: router.runtime, `routes_as`).

    ``canaries``: replica URL -> (language, share) of the deployments `polyspec adapt` marked
    (router.decision.canary).
    """

    pools: tuple[Pool, ...]
    default_language: str
    canaries: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    built_at: float = field(default_factory=time.time)
    languages: frozenset[str] = field(init=False)  # served, and the default
    known_languages: frozenset[str] = field(init=False)
    domains: frozenset[str] = field(init=False)  # of the pools
    pin_domains: frozenset[str] = field(init=False)  # what a client may pin: the built-in domains and the pools'
    langid_labels: LabelSet = field(init=False)  # what language ID may answer: ``known_languages``
    default_pools: tuple[Pool, ...] = field(init=False)
    no_spec_pools: tuple[Pool, ...] = field(init=False)  # pools without speculation (decision.speed.extra_pools)
    memo: TableMemo = field(init=False, repr=False)
    _tiers: dict[tuple[str, str], tuple[Pool, ...]] = field(init=False, repr=False)
    _replicas: tuple[Replica, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        pools = tuple(self.pools)
        served = {lang for pool in pools for lang in pool.languages}
        languages = frozenset(served | {self.default_language})
        # The languages requests are classified and counted under: the served ones, the default, and every
        # language some pool's draft has an offline figure for. The speed policy can predict (and serve,
        # through a pool without speculation) those too; and Italian with no Italian pool is counted as
        # Italian (routed as a language without a pool), not folded into the nearest served language, so its
        # traffic shows up for `polyspec adapt` and the dashboard under either policy.
        known = languages | {lang for pool in pools for lang in pool.offline_acceptance}
        domains = frozenset(p.domain for p in pools)
        tiers: dict[tuple[str, str], list[Pool]] = {}
        for pool in pools:  # in table order, as each tier lists them
            for lang in pool.languages:
                tiers.setdefault((lang, pool.domain), []).append(pool)
        frozen_tiers = {key: tuple(found) for key, found in tiers.items()}
        marked = tuple(p for p in pools if p.is_default)
        replicas: dict[str, Replica] = {}
        for pool in pools:
            for replica in pool.replicas:
                replicas.setdefault(replica.url, replica)
        derived = {
            "pools": pools, "languages": languages, "known_languages": known, "domains": domains,
            "pin_domains": frozenset(DOMAINS) | domains, "langid_labels": allowed_labels(known),
            "default_pools": marked or frozen_tiers.get((self.default_language, GENERAL), ()),
            "no_spec_pools": tuple(p for p in pools if not p.speculates), "memo": TableMemo(),
            "_tiers": frozen_tiers, "_replicas": tuple(replicas.values()),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def routes_as(self, other: RoutingTable) -> bool:
        """Whether ``other`` routes every request as this one does: the same pools (replicas, figures and
        step times included), canaries and default language. A refresh that finds the registry unchanged
        keeps its table, and with it the memo."""
        return (self.default_language == other.default_language and self.pools == other.pools
                and dict(self.canaries) == dict(other.canaries))

    def pools_for(self, language: str, domain: str) -> tuple[Pool, ...]:
        """The pools serving ``language`` in ``domain``, in table order."""
        return self._tiers.get((language, domain), ())

    def replicas(self) -> list[Replica]:
        """Every replica once, in table order."""
        return list(self._replicas)

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


def build_table(deployments: Iterable[Any], default_language: str,
                canaries: Mapping[str, tuple[str, float]] | None = None) -> RoutingTable:
    """Group deployments into pools. Deployments without a URL are not routable yet and are skipped.
    ``canaries``: as router.decision.canary.canaries_of gives them for the same deployments.

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
    return RoutingTable(pools=tuple(sorted(pools.values(), key=lambda p: p.key)), default_language=default_language,
                        canaries=dict(canaries or {}))


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
