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
from operator import itemgetter
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


def _serves_any(pool: Pool, serving: Collection[str]) -> bool:
    return any(r.url in serving for r in pool.replicas)


# A pool's place in the MAL order, as a sort key: (its first tier, 0 if it has a score else 1, -score, its key).
Place = tuple[int, int, float, str]
Places = dict[str, tuple[Place, Pool]]  # pool key -> (place, pool), in the order the tiers name them


def mal_places(
    table: RoutingTable, language: str, domain: str, live: LiveLookup, prior_steps: int,
    serving: Collection[str] | None = None,
) -> Places:
    """The MAL policy's candidates with their places in its order, unsorted: `mal_order` sorts them, and the
    speed policy sorts them once, by its own key first (router.decision.speed.rank_places). Tiers: (language, domain)
    -> (language, general) -> default; a pool named by several tiers keeps its first.

    ``serving``: URLs of the replicas serving the requested model; None means any replica will do. Every
    tier keeps only pools with such replicas, and any other pool with some comes last.
    """
    tiers: list[Sequence[Pool]] = [table.pools_for(language, domain)]
    if domain != GENERAL:
        tiers.append(table.pools_for(language, GENERAL))
    tiers.append(table.default_pools)
    if serving is not None:
        tiers.append(table.pools)
    places: Places = {}
    for tier, pools in enumerate(tiers):
        for pool in pools:
            if pool.key in places or (serving is not None and not _serves_any(pool, serving)):
                continue
            score = blended_mal(pool, language, domain, live, prior_steps)
            places[pool.key] = ((tier, 0 if score is not None else 1, -(score or 0.0), pool.key), pool)
    return places


def mal_order(places: Places) -> list[Pool]:
    """The candidates of `mal_places` in the MAL policy's order."""
    return [pool for _, pool in sorted(places.values(), key=itemgetter(0))]


def candidate_pools(
    table: RoutingTable, language: str, domain: str, live: LiveLookup, prior_steps: int,
    serving: Collection[str] | None = None,
) -> list[Pool]:
    """Pools in fallback order: (language, domain) -> (language, general) -> default, each tier by blended
    MAL (`mal_places` says more)."""
    return mal_order(mal_places(table, language, domain, live, prior_steps, serving))


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
