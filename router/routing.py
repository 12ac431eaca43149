"""The routing decision for one request body: which language, domain, pools and replicas.

`route` is the router's whole decision and nothing else (no telemetry, no capture, no I/O to engines):
`router.proxy.prepare` serves requests with it and `polyspec route explain` explains them with it, so the
two can never disagree. Its cost is bounded: router.body and router.classify say how.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from polyspec.router import canary
from polyspec.router.body import Body, decode_body, field
from polyspec.router.classify import Decision, classify, pop_router_fields, table_domains
from polyspec.router.errors import BadRequest, ModelNotFound, NoBackend
from polyspec.router.policy import Target, candidate_pools, plan_attempts
from polyspec.router.speed import Ranking, SpeedInputs, extra_pools, rank
from polyspec.router.table import Pool

if TYPE_CHECKING:
    from polyspec.router.runtime import RouterRuntime

ModelFilter = Callable[["RouterRuntime", Any], "frozenset[str] | None"]


@dataclass
class Routing:
    body: Body  # what goes to the engine, the router's own field removed
    strict: bool  # msgspec may re-encode the body (router.body.decode_body)
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
    decision = classify(body, kind, headers, pins, rt.languages_of(table), rt.default_language, c.language_threshold,
                        c.langid_max_chars, allowed=rt.langid_labels(table), domains=table_domains(table))
    live = rt.telemetry.live_lookup()
    pools = candidate_pools(table, decision.language, decision.domain, live, c.prior_spec_steps, serving)
    ranking = None
    if c.policy == "speed":
        inputs = SpeedInputs(live, rt.live_steps, rt.explorer, rt.backends.in_flight, rt.backends.is_healthy,
                             c.prior_spec_steps, c.prior_step_requests, c.speed_confidence_z)
        extra = extra_pools(table, decision.language, decision.domain, live, serving)
        memo = table.cached("speed_memo")
        memo = table.cache("speed_memo", {}) if memo is None else memo
        ranking = rank(pools, extra, decision.language, decision.domain, inputs, memo)
        pools = [cand.pool for cand in ranking.candidates]
    # a canary takes its share of its language and is last for everything else (router.canary)
    pools = canary.apply(pools, decision.language, table.cached(canary.CACHE_KEY), random.random())
    targets = plan_attempts(pools, rt.backends.is_healthy, rt.backends.in_flight, c.max_attempts, serving)
    return Routing(body, strict, pins, serving, decision, pools, targets, ranking)
