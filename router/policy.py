"""Routing policy: which pools may serve a (language, domain), in which order, and which replica first.

Pool score = blended mean acceptance length (MAL) of the pool's draft on the request's language:

    MAL_blend = (w0 * MAL_offline + n * MAL_live) / (w0 + n)

where n is the number of live speculative steps seen for (language, domain, draft), MAL_live =
1 + accepted / n, and w0 = ``RouterConfig.prior_spec_steps`` (the offline evaluation counts as w0
steps of evidence). With no live steps the offline figure stands; as traffic grows the live figure
takes over. A pool with no offline figure scores MAL_live, or ranks after scored pools while it has
no live steps either.

Order of pools (duplicates removed): (language, domain) by score, then (language, "general") by
score, then the default pool(s). Within a pool: healthy replicas only, fewest in-flight first.

A request for one engine model id (not a router alias) is served only by replicas whose engine
serves that model: every tier keeps only those, and any other pool with such replicas comes last, so
the model is honoured before the language.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from polyspec.core.acceptance import mean_acceptance_length
from polyspec.router.table import GENERAL, Pool, Replica, RoutingTable


class AcceptanceCounts(Protocol):
    """What the blend reads of a live aggregate (core.counters.SpecCounts, router.table.LiveRow)."""

    @property
    def num_spec_steps(self) -> int: ...

    @property
    def num_accepted_tokens(self) -> int: ...


LiveLookup = Mapping[tuple[str, str, str], AcceptanceCounts]


def blended_mal(pool: Pool, language: str, domain: str, live: LiveLookup, prior_steps: int) -> float | None:
    offline = pool.offline_mal.get(language)
    row = live.get((language, domain, pool.draft))
    n = row.num_spec_steps if row else 0
    live_mal = mean_acceptance_length(row.num_accepted_tokens, n) if row else None
    if offline is None:
        return live_mal
    if live_mal is None:
        return offline
    return (prior_steps * offline + n * live_mal) / (prior_steps + n)


def _ranked(pools: Sequence[Pool], language: str, domain: str, live: LiveLookup, prior_steps: int) -> list[Pool]:
    def key(pool: Pool) -> tuple[int, float, str]:
        score = blended_mal(pool, language, domain, live, prior_steps)
        return (0 if score is not None else 1, -(score or 0.0), pool.key)

    return sorted(pools, key=key)


def _serves_any(pool: Pool, serving: Collection[str]) -> bool:
    return any(r.url in serving for r in pool.replicas)


def candidate_pools(
    table: RoutingTable, language: str, domain: str, live: LiveLookup, prior_steps: int,
    serving: Collection[str] | None = None,
) -> list[Pool]:
    """Pools in fallback order: (language, domain) -> (language, general) -> default.

    ``serving``: URLs of the replicas serving the requested model; None means any replica will do.
    """
    tiers: list[Sequence[Pool]] = [table.pools_for(language, domain)]
    if domain != GENERAL:
        tiers.append(table.pools_for(language, GENERAL))
    tiers.append(table.default_pools)
    if serving is not None:
        tiers = [[p for p in tier if _serves_any(p, serving)] for tier in tiers]
        tiers.append([p for p in table.pools if _serves_any(p, serving)])
    ordered: list[Pool] = []
    for tier in tiers:
        ordered.extend(_ranked(tier, language, domain, live, prior_steps))
    seen: set[str] = set()
    unique = []
    for pool in ordered:
        if pool.key not in seen:
            seen.add(pool.key)
            unique.append(pool)
    return unique


@dataclass(frozen=True)
class Target:
    pool: Pool
    replica: Replica


_tiebreak = itertools.count()


def plan_attempts(
    pools: list[Pool],
    is_healthy: Callable[[str], bool],
    in_flight: Callable[[str], int],
    max_attempts: int,
    serving: Collection[str] | None = None,
) -> list[Target]:
    """Replicas to try, in order: healthy only, fewest in-flight first inside each pool, pools in order.

    Ties in in-flight rotate so that idle replicas of one pool share the load. ``serving`` as in
    `candidate_pools` (a pool of bare-verifier deployments may mix engines of several models).
    """
    rotate = next(_tiebreak)
    targets: list[Target] = []
    tried: set[str] = set()
    for pool in pools:
        healthy = [r for r in pool.replicas
                   if is_healthy(r.url) and r.url not in tried and (serving is None or r.url in serving)]
        if not healthy:
            continue
        shift = rotate % len(healthy)
        healthy = healthy[shift:] + healthy[:shift]
        healthy.sort(key=lambda r: in_flight(r.url))  # stable: rotation breaks ties
        for replica in healthy:
            targets.append(Target(pool, replica))
            tried.add(replica.url)
            if len(targets) >= max_attempts:
                return targets
    return targets
