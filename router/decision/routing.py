"""The routing decision for one request body: which language, domain, pools and replicas.

`route` is the router's whole decision and nothing else (no telemetry, no capture, no I/O to engines):
`router.engine.proxy.prepare` serves requests with it and `polyspec route explain` explains them with it, so the
two can never disagree. Its cost is bounded: router.edge.body and router.decision.classify say how.

When language ID is unsure of a short text (a fallback with likely labels), a wrong guess would send it to a
draft that does not know its language; the default pool is a guess too. So the request goes first to the
pools that cover the likely labels (`unsure_pools`): those serving every one of them, best mean offline
acceptance over them first; where none serves them all, the broadest pool serving several languages (the
multilingual draft). The default pools follow for failover; with no such pool, the fallback is unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from polyspec.router.decision import canary
from polyspec.router.edge.body import Body, decode_body, field
from polyspec.router.decision.classify import Decision, classify_for, pop_router_fields
from polyspec.router.errors import BadRequest, ModelNotFound, NoBackend
from polyspec.router.decision.policy import GENERAL, Target, mal_order, mal_places, plan_attempts
from polyspec.router.decision.speed import Ranking, SpeedInputs, extra_pools, rank, rank_places
from polyspec.router.table import MEMO_LIMIT, Pool, RoutingTable

if TYPE_CHECKING:
    from polyspec.router.runtime import RouterRuntime

ModelFilter = Callable[["RouterRuntime", Any], "frozenset[str] | None"]


@dataclass
class Routing:
    body: Body  # what goes to the engine, the router's own field removed
    strict: bool  # msgspec may re-encode the body (router.edge.body.decode_body)
    pins: dict[str, Any]
    serving: frozenset[str] | None  # replicas serving the requested model; None for a router alias
    decision: Decision
    pools: list[Pool]
    targets: list[Target]
    ranking: Ranking | None = None  # the speed policy's candidates and reason; None under the MAL policy


def model_filter(rt: RouterRuntime, model: Any) -> frozenset[str] | None:
    """URLs of the replicas that may serve ``model``; None for a router alias (any replica)."""
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required.", param="model")
    if model in rt.config.model_aliases:
        return None
    serving = rt.backends.serving(model)
    if not serving:
        if not rt.backends.model_ids():
            raise NoBackend("No engine has answered yet; try again shortly.")
        raise ModelNotFound(f"The model '{model}' does not exist. Known: {', '.join(rt.known_models())}.", param="model")
    return serving


def route(rt: RouterRuntime, raw: bytes, headers: dict[str, str], kind: str,
                serving_of: ModelFilter = model_filter) -> Routing:
    """Decode, validate, classify and rank: the ``Routing`` of one request (a RouterError if it has none)."""
    c, table = rt.config, rt.table
    body, strict = decode_body(raw)
    pins = pop_router_fields(body)
    serving = serving_of(rt, field(body, "model"))
    decision = classify_for(table, body, kind, headers, pins, c.language_threshold, c.langid_max_chars)
    live = rt.telemetry.live_lookup()
    places = mal_places(table, decision.language, decision.domain, live, c.prior_spec_steps, serving)
    ranking = None
    covering = unsure_pools(table, decision.likely, decision.domain, serving) if decision.likely else []
    if c.policy == "speed":
        inputs = speed_inputs(rt, live)
        if covering:  # ranked among themselves, for the likeliest label
            ranking = rank(covering, [], decision.likely[0], decision.domain, inputs, table.memo.speed)
            covering = [cand.pool for cand in ranking.candidates] or covering
            pools = mal_order(places)
        else:  # one sort: by speed, ties in the MAL order
            extra = extra_pools(table, decision.language, decision.domain, live, serving)
            ranking = rank_places(places, extra, decision.language, decision.domain, inputs, table.memo.speed)
            pools = [cand.pool for cand in ranking.candidates]
    else:
        pools = mal_order(places)
    if covering:  # the usual order follows, for failover
        keys = {p.key for p in covering}
        pools = covering + [p for p in pools if p.key not in keys]
    # a canary takes its share of its language and is last for everything else (router.decision.canary)
    pools = canary.apply(pools, decision.language, table.canaries, random.random())
    targets = plan_attempts(pools, rt.backends.is_healthy, rt.backends.in_flight, c.max_attempts, serving)
    return Routing(body, strict, pins, serving, decision, pools, targets, ranking)


def speed_inputs(rt: RouterRuntime, live: Any) -> SpeedInputs:
    """The speed policy's inputs, built once per live mapping (``telemetry.live_lookup()``, replaced when a
    refresh or a flush changes it; updated in place per request otherwise), not once per request: every
    other input is the runtime's for its whole life."""
    inputs = rt.speed_inputs
    if inputs is None or inputs.live is not live:
        c = rt.config
        inputs = SpeedInputs(live, rt.live_steps, rt.explorer, rt.backends.in_flight, rt.backends.is_healthy,
                             c.prior_spec_steps, c.prior_step_requests, c.speed_confidence_z)
        rt.speed_inputs = inputs
    return inputs


def unsure_pools(table: RoutingTable, likely: tuple[str, ...], domain: str,
                 serving: Collection[str] | None = None) -> list[Pool]:
    """The speculating pools to serve a text language ID is unsure of, best first: those of ``domain`` or
    general that serve every label of ``likely``, by their mean offline MAL over the labels (a pool without a
    figure for one counts 1 there: nothing accepted); where none serves them all, the pool serving the most
    languages, if it serves several and one of ``likely`` (the multilingual draft). Empty when no pool
    qualifies: the fallback to the default pools stands. Kept with the table per (labels, domain)
    (``table.memo.unsure``: labels of the table's own languages, bounded again there)."""
    memo = table.memo.unsure
    key = (likely, domain)
    found = memo.get(key)
    if found is None:
        found = tuple(_unsure_pools(table, likely, domain))
        if len(memo) < MEMO_LIMIT:
            memo[key] = found
    if serving is None:
        return list(found)
    return [p for p in found if any(r.url in serving for r in p.replicas)]


def _unsure_pools(table: RoutingTable, likely: tuple[str, ...], domain: str) -> list[Pool]:
    usable = [p for p in table.pools if p.speculates and p.domain in (domain, GENERAL)]
    covering = [p for p in usable if all(p.serves(lang) for lang in likely)]
    if covering:
        def score(pool: Pool) -> tuple[int, float, str]:
            mal = sum(pool.offline_mal.get(lang, 1.0) for lang in likely) / len(likely)
            return (0 if pool.domain == domain else 1, -mal, pool.key)

        return sorted(covering, key=score)
    broad = [p for p in usable if len(p.languages) > 1 and any(p.serves(lang) for lang in likely)]
    if not broad:
        return []
    return [max(broad, key=lambda p: (len(p.languages), p.domain == domain, p.key))]
