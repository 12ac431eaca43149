"""The speed policy: rank the pools that may serve a request by predicted tokens per second (core.speed).

For each candidate pool (those of the MAL policy's tiers, every pool without speculation, which serves any
language with the verifier's own output, and every pool whose draft has evidence on the language):

    predicted tokens/s = E_k(language, domain) / step_s(batch)

- ``E_k`` blends the draft's offline per-position acceptance on the language (as ``prior_spec_steps``
  steps of evidence) with the live counters of (language, domain, draft); 1 without speculation. A draft
  with no evidence on the language counts as accepting nothing (E = 1) until traffic says otherwise.
- ``step_s`` is the calibrated step time at the batch the pool would run (in-flight on its least loaded
  healthy replica, plus this request), blended with what this router measured. Both are pooled over the
  engines of one shape (router.table.build_table): their step time is one quantity, measured several times.
- Pools are ranked by the lower confidence bound of E (``speed_confidence_z``) over the step time: a draft
  with few samples does not win on luck. The MAL policy's first pool (the incumbent) is ranked by its point
  estimate instead, so it does not lose on bad luck either: another pool must be surely faster to take over. While any candidate lacks a step time (never calibrated, never
  measured) the MAL order stands: the comparison would be unfair to the pool nobody measured.
- Candidates: the MAL policy's tiers, then pools without speculation and pools whose draft has evidence on
  the language (``extra_pools``).
- Exploration: one request in ``1 / explore_share`` of a (language, domain) goes to the candidate other
  than the best with the least evidence, so that no estimate goes stale and uncalibrated pools get measured.

Failover is unchanged: the attempts follow this order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from polyspec.core.speed import AcceptanceEstimate, blend_acceptance, blend_step, interpolate
from polyspec.router.table import MEMO_LIMIT, Pool, RoutingTable

STEP_WINDOW = 200  # live step times: a running mean over about this many requests, then recency-weighted
MIN_STEPS = 4  # a request of fewer steps is mostly prefill: its time says little about the step cost
_MAX_KEYS = 4096  # explore counters and step buckets are keyed by bounded labels; bound them anyway
SpeedMemo = dict[tuple[str, str, str, int, int], tuple[float, float, float]]  # router.table.TableMemo.speed


def batch_bucket(batch: int) -> int:
    """Live step times are kept per power-of-two batch size (1, 2, 4, 8, ...)."""
    return 1 << max(0, int(batch) - 1).bit_length()


class LiveSteps:
    """Seconds per step as this router measured them, per replica URL and batch bucket."""

    def __init__(self) -> None:
        self._means: dict[tuple[str, int], tuple[float, int]] = {}

    def observe(self, url: str, batch: int, seconds: float, steps: int, tokens: int) -> None:
        """One answered request: ``steps`` verify steps (its tokens without a draft) in ``seconds``. An engine
        reporting more steps than tokens (each step yields at least one) is not believed: a broken or hostile
        report must not make a pool look fast."""
        if steps < MIN_STEPS or steps > tokens or not math.isfinite(seconds) or seconds <= 0:
            return
        key = (url, batch_bucket(batch))
        mean, n = self._means.get(key, (0.0, 0))
        if n == 0 and len(self._means) >= _MAX_KEYS:
            return
        n = min(n + 1, STEP_WINDOW)
        self._means[key] = (mean + (seconds / steps - mean) / n, n)

    def get(self, urls: Collection[str], batch: int) -> tuple[float | None, int]:
        """Mean over the replicas measured at this batch bucket, and the requests behind it."""
        bucket = batch_bucket(batch)
        found = [self._means[(u, bucket)] for u in urls if (u, bucket) in self._means]
        if not found:
            return None, 0
        n = sum(c for _, c in found)
        return sum(m * c for m, c in found) / n, n

    def describe(self) -> list[dict[str, Any]]:
        return [{"url": u, "batch": b, "step_s": round(m, 6), "requests": n}
                for (u, b), (m, n) in sorted(self._means.items())]


class Explorer:
    """Every ``1 / share``-th request of a (language, domain) explores; deterministic, so tests can count it."""

    def __init__(self, share: float) -> None:
        self.every = round(1 / share) if share > 0 else 0
        self._counts: dict[tuple[str, str], int] = {}

    def tick(self, language: str, domain: str) -> bool:
        if not self.every:
            return False
        key = (language, domain)
        if key not in self._counts and len(self._counts) >= _MAX_KEYS:
            return False
        n = self._counts[key] = self._counts.get(key, 0) + 1
        return n % self.every == 0


@dataclass(slots=True)  # not frozen: built for every pool on every request, and frozen init is slower
class Candidate:
    pool: Pool
    batch: int  # streams the pool's least loaded replica would run with this request
    expected: float  # E_k, tokens per step
    lower: float  # its lower confidence bound
    samples: float  # requests (and offline prompts) behind E; inf without speculation
    step_s: float | None
    step_source: str  # calibrated | live | calibrated+live | none
    tps: float | None  # predicted tokens/s of one stream
    lower_tps: float | None  # the ranking key

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None, nd: int = 3) -> float | None:
            return None if x is None else round(x, nd)

        return {"pool": self.pool.key, "draft": self.pool.draft, "k": self.pool.k, "batch": self.batch,
                "expected_tokens_per_step": r(self.expected), "expected_lower": r(self.lower),
                "samples": None if math.isinf(self.samples) else round(self.samples, 1),
                "step_s": r(self.step_s, 5), "step_source": self.step_source,
                "step_engines": len(self.pool.step_urls) or len(self.pool.replicas),
                "predicted_tps": r(self.tps, 2), "predicted_tps_lower": r(self.lower_tps, 2)}


@dataclass(frozen=True)
class Ranking:
    candidates: list[Candidate]  # in the order the attempts follow
    reason: str  # fastest | explore | no_speed_model | no_candidate

    @property
    def chosen(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None


@dataclass(frozen=True)
class SpeedInputs:
    live: Mapping[tuple[str, str, str], Any]  # (language, domain, draft) -> SpecCounts
    steps: LiveSteps
    explorer: Explorer
    in_flight: Callable[[str], int]
    is_healthy: Callable[[str], bool]
    prior_spec_steps: int
    prior_step_requests: int
    z: float


def acceptance_of(pool: Pool, language: str, domain: str, inputs: SpeedInputs) -> AcceptanceEstimate:
    row = inputs.live.get((language, domain, pool.draft))
    estimate = blend_acceptance(
        pool.offline_acceptance.get(language), pool.offline_samples.get(language, 0), inputs.prior_spec_steps,
        row.accepted_per_pos if row else (), row.num_spec_steps if row else 0, row.requests if row else 0)
    return estimate or AcceptanceEstimate((), 0.0, 0)  # no evidence: nothing accepted until measured


_SOURCES = {(True, True): "calibrated+live", (True, False): "calibrated", (False, True): "live", (False, False): "none"}


def _tokens_per_step(pool: Pool, language: str, domain: str, inputs: SpeedInputs,
                     memo: SpeedMemo) -> tuple[float, float, float]:
    """(E, its lower bound, samples), memoised per table (its TableMemo) on the live counts they depend on:
    the offline part never changes within a table and the live part only when a request of that key
    finishes, so the hot path recomputes them once per change instead of once per request."""
    if not pool.speculates:
        return 1.0, 1.0, math.inf
    row = inputs.live.get((language, domain, pool.draft))
    key = (pool.key, language, domain, row.num_spec_steps if row else 0, row.requests if row else 0)
    hit = memo.get(key)
    if hit is None:
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        est = acceptance_of(pool, language, domain, inputs)
        hit = memo[key] = (est.mean(pool.k), est.lower(pool.k, inputs.z), est.samples)
    return hit


def candidate(pool: Pool, language: str, domain: str, inputs: SpeedInputs,
              memo: SpeedMemo | None = None) -> Candidate:
    is_healthy = inputs.is_healthy
    urls = [r.url for r in pool.replicas if is_healthy(r.url)] or [r.url for r in pool.replicas]
    batch = min(inputs.in_flight(u) for u in urls) + 1 if urls else 1
    expected, lower, samples = _tokens_per_step(pool, language, domain, inputs, {} if memo is None else memo)
    calibrated = interpolate(pool.step_s, batch) if pool.step_s else None
    live, n = inputs.steps.get(pool.step_urls or urls, batch)  # engines of one shape share one step time
    step = blend_step(calibrated, live, n, inputs.prior_step_requests)
    source = _SOURCES[(calibrated is not None, live is not None)]
    if step is None or step <= 0:
        return Candidate(pool, batch, expected, lower, samples, None, source, None, None)
    return Candidate(pool, batch, expected, lower, samples, step, source, expected / step, lower / step)


def rank(pools_mal_order: list[Pool], extra: list[Pool], language: str, domain: str, inputs: SpeedInputs,
         memo: SpeedMemo | None = None) -> Ranking:
    """``pools_mal_order``: the MAL policy's candidates in its order (router.decision.policy.candidate_pools);
    ``extra``: the other pools that may serve the request (``extra_pools``). ``memo``: the routing table's
    (``table.memo.speed``)."""
    places: dict[str, tuple[tuple[int], Pool]] = {}
    for i, pool in enumerate(pools_mal_order):
        places.setdefault(pool.key, ((i,), pool))
    return rank_places(places, extra, language, domain, inputs, memo)


def rank_places(places: Mapping[str, tuple[Any, Pool]], extra: list[Pool], language: str, domain: str,
                inputs: SpeedInputs, memo: SpeedMemo | None = None) -> Ranking:
    """`rank` of the MAL policy's candidates as router.decision.policy.mal_places gives them: unsorted, each with its
    place in that policy's order. The pools are sorted once, by predicted speed, ties in the MAL order."""
    pools = [pool for _, pool in places.values()] + [p for p in extra if p.key not in places]
    if not pools:
        return Ranking([], "no_candidate")
    memo = {} if memo is None else memo
    scored = [candidate(p, language, domain, inputs, memo) for p in pools]
    tiered = scored[:len(places)]  # the MAL policy's candidates; the extra pools follow, in their order
    if any(c.lower_tps is None for c in scored):
        # A candidate without a step time (never calibrated, never measured) cannot be compared: a pool
        # measured live would always beat the language's own uncalibrated pool. So the MAL order stands,
        # exactly as before (pools no tier names are left out), until every candidate has a step time.
        return Ranking(sorted(tiered, key=lambda c: places[c.pool.key][0]), "no_speed_model")
    # The MAL policy's first pool (the language's own draft, or the default) is the incumbent and is judged
    # by its point estimate; every other pool by its lower bound. A pool with little evidence thus neither
    # wins nor loses on luck: a new draft serving its own language keeps its traffic until another pool is
    # surely faster, and a measured alternative (no speculation, say) takes over once it is.
    incumbent = min(tiered, key=lambda c: places[c.pool.key][0]).pool.key if tiered else None
    after = {c.pool.key: (0, places[c.pool.key][0]) for c in tiered}  # ties: the MAL order, then the extras'
    after.update((c.pool.key, (1, i)) for i, c in enumerate(scored[len(places):]))
    order = sorted(scored, key=lambda c: (-((c.tps if c.pool.key == incumbent else c.lower_tps) or 0.0),
                                          after[c.pool.key]))
    if len(order) > 1 and inputs.explorer.tick(language, domain):
        others = order[1:]
        pick = min(others, key=lambda c: (c.samples if c.step_s is not None else -1.0, others.index(c)))
        order.remove(pick)
        return Ranking([pick, *order], "explore")
    return Ranking(order, "fastest")


def extra_pools(table: RoutingTable, language: str, domain: str, live: Mapping[tuple[str, str, str], Any],
                serving: Collection[str] | None) -> list[Pool]:
    """Candidates no tier names: pools without speculation (the verifier alone answers any language exactly
    as a draft would, speculation never changes the output), then pools whose draft has evidence on the
    language, an offline figure or live counters (a French draft may accept Italian better than the default
    English one does)."""
    pools = list(table.no_spec_pools) + [p for p in table.pools if p.speculates and (
        language in p.offline_acceptance or (language, domain, p.draft) in live)]
    if serving is None:
        return pools
    return [p for p in pools if any(r.url in serving for r in p.replicas)]
