"""What the router would do with one request, and why: `polyspec route explain` (its command is in router/cli.py).

It reads an OpenAI request body on stdin (and headers given with ``--header``), loads the registry the way
a freshly started router does (routing table from the active deployments, live acceptance from every
router's shared stats), then runs the router's own decision, ``router.decision.routing.route`` (what
``proxy.prepare`` runs: decoding, pins, the model filter, classification, pool ranking, replica order).
Nothing here re-implements a routing rule, so explain cannot disagree with the router; when a rule
changes (pin normalisation, say), explain follows.

What it cannot know offline is replica health and which engine serves which model: without ``--probe``
every replica counts as healthy (as in a router that has not probed yet) and in-flight counts are zero.
``--probe`` runs the router's own health probe once per replica (``/health``, then ``/v1/models``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from polyspec.core.acceptance import mean_acceptance_length
from polyspec.core.console import console
from polyspec.core.errors import InvalidInput
from polyspec.registry import open_registry
from polyspec.router.edge.body import field as body_field
from polyspec.router.decision.classify import Decision
from polyspec.router.config import RouterConfig
from polyspec.router.errors import BadRequest, NoBackend, RouterError
from polyspec.router.decision.policy import GENERAL, Target, blended_mal
from polyspec.router.decision.routing import model_filter, route
from polyspec.router.runtime import RouterRuntime
from polyspec.router.table import Pool, RoutingTable, build_table, to_live_row
from polyspec.router.telemetry import merge_rows

ENDPOINTS = ("chat", "completions")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP header name (RFC 9110 token)


@dataclass
class PoolFigures:
    """One candidate pool as the policy saw it, for the request's language and domain."""

    rank: int
    tier: str  # which fallback step offered it: "language+domain", "language", "default" or "model"
    pool: str
    draft: str
    languages: list[str]
    domain: str
    is_default: bool
    offline_mal: float | None
    live_mal: float | None
    live_spec_steps: int
    blended_mal: float | None  # router.decision.policy.blended_mal: the figure the MAL policy ranks by
    replicas: list[dict[str, Any]]
    speed: dict[str, Any] | None = None  # router.decision.speed.Candidate.to_json(): what the speed policy ranks by


@dataclass
class Explanation:
    endpoint: str
    registry: str
    model: Any
    settings: dict[str, Any]
    decision: dict[str, Any]
    table_pools: int
    pools: list[PoolFigures]
    attempts: list[dict[str, str]]
    chosen: dict[str, str] | None
    health: str  # "assumed" (not probed) or "probed"
    outcome: dict[str, Any]  # {"status": 200} or the OpenAI error the router would answer
    reason: str
    notes: list[str] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=dict)  # {"policy": "speed"|"mal", "reason": ...}


# --- input ---------------------------------------------------------------------------------------
def read_limited(stream: Any, limit: int) -> bytes:
    """At most ``limit`` bytes of ``stream``; more is refused, as the router refuses (413) a larger body."""
    raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise InvalidInput(f"the request body is over {limit} bytes, the router's limit (max_body_bytes); "
                           "the router would answer 413 request_too_large",
                           hint="raise POLYSPEC_ROUTER_MAX_BODY_BYTES if such bodies are expected")
    return raw


def parse_headers(items: list[str]) -> dict[str, str]:
    """``K:V`` strings as the router sees headers: names lower-cased, the last of a repeated name wins."""
    headers: dict[str, str] = {}
    for item in items:
        name, colon, value = item.partition(":")
        name = name.strip()
        if not colon or not _TOKEN.fullmatch(name):
            raise InvalidInput(f"--header {item!r} is not NAME:VALUE (e.g. 'X-Polyspec-Language: fr')")
        headers[name.lower()] = value.strip()
    return headers


def endpoint_of(body: Mapping[str, Any], endpoint: str | None) -> str:
    """The endpoint given, else completions for a body with a prompt and no messages, else chat."""
    if endpoint is not None:
        if endpoint not in ENDPOINTS:
            raise InvalidInput(f"--endpoint must be one of {', '.join(ENDPOINTS)}, not {endpoint!r}")
        return endpoint
    return "completions" if "prompt" in body and "messages" not in body else "chat"


# --- the router's state, as a fresh router builds it ---------------------------------------------
class _RegistrySnapshot:
    """A TableSource over a registry opened with ``create=False``: explain never makes a registry appear."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def deployments(self) -> list[Any]:
        return list(self.registry.active_deployments())

    def live_stats(self) -> list[Any]:
        return [to_live_row(row) for row in self.registry.live_stats()]

    def record_live_stats(self, router_id: str, rows: Any) -> None:  # explain never flushes: never called
        raise RuntimeError("route explain is read-only")


def load_runtime(config: RouterConfig) -> RouterRuntime:
    """A router runtime holding the registry's table and shared live stats; raises RegistryMissing."""
    registry = open_registry(config.registry_url, create=False)
    try:
        source = _RegistrySnapshot(registry)
        rt = RouterRuntime(config, source)
        rt.table = build_table(source.deployments(), rt.default_language)
        rt.backends.sync([(r.name, r.url) for r in rt.table.replicas()])
        rt.telemetry.set_shared(merge_rows(source.live_stats()))
    finally:
        registry.close()
    return rt


async def probe_replicas(rt: RouterRuntime) -> None:
    try:
        await rt.backends.probe_all()
    finally:
        await rt.backends.aclose()


# --- the decision ---------------------------------------------------------------------------------
def _tier(table: RoutingTable, pool: Pool, language: str, domain: str) -> str:
    if any(p.key == pool.key for p in table.pools_for(language, domain)):
        return "language+domain"
    if domain != GENERAL and any(p.key == pool.key for p in table.pools_for(language, GENERAL)):
        return "language"
    if any(p.key == pool.key for p in table.default_pools):
        return "default"
    return "model" if pool.speculates else "no-speculation"


def _figures(rt: RouterRuntime, pools: list[Pool], d: Decision, serving: frozenset[str] | None,
             speed: Mapping[str, dict[str, Any]]) -> list[PoolFigures]:
    live, prior = rt.telemetry.live_lookup(), rt.config.prior_spec_steps
    out = []
    for rank, pool in enumerate(pools, 1):
        row = live.get((d.language, d.domain, pool.draft))
        steps = row.num_spec_steps if row else 0
        replicas = [{"name": r.name, "url": r.url, "healthy": rt.backends.is_healthy(r.url),
                     "serves_model": serving is None or r.url in serving} for r in pool.replicas]
        out.append(PoolFigures(
            rank, _tier(rt.table, pool, d.language, d.domain), pool.key, pool.draft, list(pool.languages),
            pool.domain, pool.is_default, pool.offline_mal.get(d.language),
            mean_acceptance_length(row.num_accepted_tokens, steps) if row else None, steps,
            blended_mal(pool, d.language, d.domain, live, prior), replicas, speed.get(pool.key)))
    return out


def decide(rt: RouterRuntime, raw: bytes, headers: dict[str, str], kind: str, probed: bool) -> Explanation:
    """Run the router's own decision (`router.decision.routing.route`, what proxy.prepare runs) on one request body and
    explain the outcome. A request the router answers 400 raises its BadRequest."""
    notes: list[str] = []
    refused: list[RouterError] = []

    def serving_of(rt_: RouterRuntime, model: Any) -> frozenset[str] | None:
        try:
            return model_filter(rt_, model)
        except BadRequest:
            raise
        except RouterError as exc:  # the model is no alias, and no probed engine serves it (404 / 503)
            if probed:
                refused.append(exc)
            else:
                notes.append(f"model {model!r} is not a router alias: the router sends it only to replicas "
                             "whose engine serves it; without --probe explain cannot tell which, so all are shown")
            return None

    routing = route(rt, raw, headers, kind, serving_of=serving_of)
    c, d, pins, serving = rt.config, routing.decision, routing.pins, routing.serving
    model = body_field(routing.body, "model")
    outcome_error: RouterError | None = refused[0] if refused else None
    model_refused = bool(refused)
    pools = [] if outcome_error else routing.pools
    targets = [] if outcome_error else routing.targets
    ranking = None if outcome_error else routing.ranking
    speed = {cand.pool.key: cand.to_json() for cand in ranking.candidates} if ranking else {}
    figures = _figures(rt, pools, d, serving, speed)
    if not targets and outcome_error is None:  # the very error proxy.prepare raises then
        outcome_error = NoBackend(f"No healthy engine for language '{d.language}' (domain '{d.domain}') "
                                  "nor in the default pool.")
    outcome = {"status": 200} if outcome_error is None else {
        "status": outcome_error.status, **outcome_error.body()["error"]}
    if targets and len(targets[0].pool.replicas) > 1:
        notes.append("the chosen pool has several replicas: the router sends each request to the one with the "
                     "fewest requests in flight, rotating between idle ones, so another replica may get it")
    if not probed and figures:
        notes.append("replica health was not probed: every replica is assumed healthy, as a router assumes before "
                     "its first probe (--probe checks each one's /health)")
    pinned_domain = bool(headers.get("x-polyspec-domain") or pins.get("domain"))
    return Explanation(
        endpoint=kind, registry="", model=model,
        settings={"language_threshold": c.language_threshold, "default_language": rt.default_language,
                  "prior_spec_steps": c.prior_spec_steps, "max_attempts": c.max_attempts, "policy": c.policy,
                  "explore_share": c.explore_share, "speed_confidence_z": c.speed_confidence_z},
        decision={"language": d.language, "confidence": round(d.confidence, 4), "detected": d.detected,
                  "source": d.source, "domain": d.domain, "domain_pinned": pinned_domain,
                  "stats_language": d.stats_language},
        table_pools=len(rt.table.pools), pools=figures,
        attempts=[_target(t) for t in targets], chosen=_target(targets[0]) if targets else None,
        health="probed" if probed else "assumed", outcome=outcome,
        reason=reason(d, pinned_domain, figures, targets, outcome_error, rt, probed, model_refused,
                      ranking.reason if ranking else None),
        notes=notes, policy={"policy": c.policy, "reason": ranking.reason if ranking else None})


def _target(t: Target) -> dict[str, str]:
    return {"pool": t.pool.key, "draft": t.pool.draft, "replica": t.replica.name, "url": t.replica.url}


# --- the reason, in words --------------------------------------------------------------------------
def _language_words(d: Decision, threshold: float) -> str:
    if d.source == "header":
        return f"{d.language} pinned by the X-Polyspec-Language header"
    if d.source == "body":
        return f"{d.language} pinned by the body's polyspec.language field"
    if d.source == "langid":
        return f"langid detected {d.language} with confidence {d.confidence:.2f} (threshold {threshold:.2f})"
    if d.detected is None:
        return f"no text to identify, so the default language {d.language} (live stats count it as und)"
    return (f"langid was unsure ({d.detected} at {d.confidence:.2f}, below the threshold {threshold:.2f}), "
            f"so the default language {d.language} (live stats count it as und)")


def _score_words(f: PoolFigures, prior: int) -> str | None:
    """The figure the pool ranked by, with where it comes from; None when it has none."""
    if f.offline_mal is not None and f.live_spec_steps:
        return (f"blended MAL {f.blended_mal:.2f} (offline {f.offline_mal:.2f} over {prior} prior steps, "
                f"live {f.live_mal:.2f} over {f.live_spec_steps} steps)")
    if f.offline_mal is not None:
        return f"offline MAL {f.offline_mal:.2f} (no live steps yet)"
    if f.blended_mal is not None:
        return f"live MAL {f.live_mal:.2f} over {f.live_spec_steps} steps (no offline figure)"
    return None


_TIER_WORDS = {
    "language+domain": "serves {lang}/{dom}",
    "language": "no pool serves {lang}/{dom}, so {lang}/general",
    "default": "no pool serves {lang}, so the default pool",
    "model": "no pool of the language or default pool serves the model, so any pool that does",
    "no-speculation": "the verifier without a draft, which serves every language",
}


def _speed_words(chosen: PoolFigures, figures: list[PoolFigures], why: str) -> str | None:
    """The speed policy's choice in words; None when it ranked nothing (no pool has a step time)."""
    s = chosen.speed
    if why not in ("fastest", "explore") or s is None or s["predicted_tps"] is None:
        return None
    basis = (f"E={s['expected_tokens_per_step']:.2f} tokens/step (lower bound {s['expected_lower']:.2f}) over "
             f"{s['step_s'] * 1000:.1f} ms/step at batch {s['batch']} ({s['step_source']}, "
             f"{s['step_engines']} engine(s) of its shape)")
    others = [f for f in figures if f is not chosen and f.speed and f.speed["predicted_tps"] is not None]
    runner = f"; next: {others[0].pool} at {others[0].speed['predicted_tps']:.2f}" if others else ""  # type: ignore[index]
    if why == "explore":
        return (f"speed policy exploring: pool {chosen.pool} ({s['predicted_tps']:.2f} tokens/s predicted, {basis}) "
                "has the least evidence; one request in 1/explore_share goes there so its estimate stays fresh")
    return (f"speed policy: pool {chosen.pool} is the fastest predicted, {s['predicted_tps']:.2f} tokens/s "
            f"(ranked by its lower bound {s['predicted_tps_lower']:.2f}; {basis}){runner}")


def reason(d: Decision, pinned_domain: bool, figures: list[PoolFigures], targets: list[Target],
           error: RouterError | None, rt: RouterRuntime, probed: bool, model_refused: bool = False,
           speed_reason: str | None = None) -> str:
    """Why the router routes (or refuses) the request, in one paragraph an operator can act on."""
    parts = [_language_words(d, rt.config.language_threshold),
             f"domain {d.domain} {'pinned' if pinned_domain else 'detected from the text'}"]
    if model_refused and error is not None:
        parts.append(f"but the model is refused: {error.message}")
    elif not rt.table.pools:
        parts.append("the registry has no active deployment with a URL, so there are no pools")
    elif not figures:
        parts.append(f"no pool serves {d.language} (domain {d.domain}) and there is no default pool")
    elif not targets:
        parts.append(f"{len(figures)} candidate pool(s), but no replica passed its health probe")
    if not targets:
        status, code = (error.status, error.code) if error is not None else (503, "no_healthy_backend")
        return "; ".join(parts) + f"; the router would answer {status} {code}."
    chosen = next(f for f in figures if f.pool == targets[0].pool.key)
    tier = _TIER_WORDS[chosen.tier].format(lang=d.language, dom=d.domain)
    score = _score_words(chosen, rt.config.prior_spec_steps)
    in_tier = sum(1 for f in figures if f.tier == chosen.tier)
    speed = _speed_words(chosen, figures, speed_reason or "")
    if speed is not None and chosen.rank == 1:
        parts.append(speed)
    elif chosen.rank > 1:
        parts.append(f"pool {chosen.pool} ({tier}), ranked {chosen.rank} with "
                     f"{score or f'no MAL figure for {d.language}'}, is the first with a healthy replica")
    elif in_tier == 1:
        parts.append(f"pool {chosen.pool} ({tier}) is the only candidate there, with "
                     f"{score or f'no MAL figure for {d.language}, offline or live'}")
    else:
        parts.append(f"pool {chosen.pool} ({tier}) ranks first of {in_tier} by "
                     f"{score or f'name (none of them has a MAL figure for {d.language})'}")
    health = "health probed" if probed else "health assumed, not probed"
    parts.append(f"replica {targets[0].replica.name} ({targets[0].replica.url}) gets it ({health})")
    return "; ".join(parts) + "."


# --- output -----------------------------------------------------------------------------------------
def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(e: Explanation) -> None:
    """The decision as a rich table plus the reason (polyspec.core.console: fixed width off a terminal)."""
    out = console()
    d = e.decision
    detected = d["detected"] or "-"
    out.print(f"[bold]{e.endpoint}[/] request for model {e.model!r}, registry {e.registry}")
    out.print(f"language [bold]{d['language']}[/] (source {d['source']}, confidence {d['confidence']:.4f}, "
              f"detected {detected}); domain [bold]{d['domain']}[/]")
    if not e.table_pools:
        out.print("[yellow]The registry has no pools (no active deployment with a URL).[/]")
    if e.pools:
        table = Table(title=f"Candidate pools for {d['language']}/{d['domain']}, in the router's order")
        lang = d["language"]
        numeric = ("#", "live steps", "tokens/step", "ms/step", "tok/s", "tok/s low")
        for name in ("#", "tier", "pool", "languages", "domain", "default", f"offline MAL ({lang})", "live MAL",
                     "live steps", "blended MAL", "tokens/step", "ms/step", "tok/s", "tok/s low", "replicas"):
            table.add_column(name, justify="right" if "MAL" in name or name in numeric else "left")
        for f in e.pools:
            replicas = ", ".join(f"{r['name']}{'' if r['healthy'] else ' (down)'}" for r in f.replicas)
            s = f.speed or {}
            step = s.get("step_s")
            table.add_row(str(f.rank), f.tier, f.pool, ",".join(f.languages), f.domain, "yes" if f.is_default else "",
                          _num(f.offline_mal), _num(f.live_mal), str(f.live_spec_steps), _num(f.blended_mal),
                          _num(s.get("expected_tokens_per_step")), _num(None if step is None else step * 1000),
                          _num(s.get("predicted_tps")), _num(s.get("predicted_tps_lower")), replicas)
        out.print(table)
    if e.chosen:
        tries = " → ".join(f"{a['replica']} ({a['url']})" for a in e.attempts)
        out.print(f"chosen: pool [bold]{e.chosen['pool']}[/], replica [bold]{e.chosen['replica']}[/] "
                  f"({e.chosen['url']}); failover order: {tries}")
    else:
        out.print(f"[red]the router would answer {e.outcome['status']} {e.outcome.get('code')}[/]: "
                  f"{e.outcome.get('message')}")
    out.print(f"reason: {e.reason}", highlight=False)
    for note in e.notes:
        out.print(f"note: {note}", highlight=False, style="dim")
