"""What `polyspec deploy plan --engines N` reads from the registry: the candidates (every active draft of the
verifier at each k, and no speculation), their acceptance, the step-time curves calibrated so far and the
traffic mix of the live statistics (registry.fleet_search does the arithmetic)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from polyspec.core.languages import MULTILINGUAL, UNDETERMINED
from polyspec.core.speed import ContextCost, mean_context_cost
from polyspec.registry import calibrations, deployments
from polyspec.registry.fleet_plan import Cell, FleetPlan, PlanError, cell
from polyspec.registry.fleet_search import MAX_PLAN_K, Candidate, Inputs, plan_fleet
from polyspec.registry.planning import with_shared_steps
from polyspec.registry.records import DraftRecord
from polyspec.registry.schema import Deployment, Draft, Verifier

NO_SPEC = "no-spec"


def plan_verifier(session: Session, requested: str | None, default: str) -> str:
    """The verifier to plan for: the one asked for, else the active deployments' (when they agree), else the
    default; it must be registered."""
    name = requested
    if name is None:
        used = {d.verifier_name for d in deployments.views(session) if d.verifier_name}
        name = used.pop() if len(used) == 1 else default
    if session.scalars(select(Verifier).where(Verifier.name == name)).first() is None:
        raise PlanError(f"verifier {name!r} is not in the registry (`polyspec registry add-verifier`)")
    return name


def drafts_of(session: Session, verifier: str) -> dict[str, DraftRecord]:
    """Every draft of the verifier, by reference ("name@version")."""
    rows = session.scalars(select(Draft).join(Verifier).where(Verifier.name == verifier).order_by(Draft.id))
    return {f"{r.name}@{r.version}": DraftRecord.of(r) for r in rows}


def short_name(draft: DraftRecord, verifier: str) -> str:
    base = draft.name[len(verifier) + 1:] if draft.name.startswith(verifier + "-") else draft.name
    base = re.sub(r"[^A-Za-z0-9_.\-]", "-", base) or "draft"
    return base if draft.version == 1 else f"{base}-v{draft.version}"


def candidates(session: Session, verifier: str, *, max_k: int = MAX_PLAN_K) -> list[Candidate]:
    out = [Candidate(NO_SPEC, None, 0, None)]
    for ref, d in drafts_of(session, verifier).items():
        if d.status != "active":
            continue
        for k in range(1, max_k + 1):
            out.append(Candidate(f"{short_name(d, verifier)}-k{k}", ref, k, d.draft_vocab_size, d.domain,
                                 tuple(d.languages)))
    return out


def gather(session: Session, verifier: str, **settings: Any) -> Inputs:
    """Acceptance of every draft of the verifier, live counters, and the calibrated step curves, prefill and
    context figures of the active deployments (engines of one shape pooled, as the router reads them), keyed by
    (draft vocabulary, k)."""
    offline: dict[str, dict[str, list[float]]] = {}
    samples: dict[str, dict[str, int]] = {}
    for row in session.scalars(select(Draft).join(Verifier).where(Verifier.name == verifier)):
        offline[f"{row.name}@{row.version}"], samples[f"{row.name}@{row.version}"] = \
            deployments._offline_acceptance(session, row)
    live = {(r.language, r.domain, r.draft_name): r for r in deployments.live_stats(session)}
    vocab = {ref: d.draft_vocab_size for ref, d in drafts_of(session, verifier).items()}
    pooled: dict[tuple[int | None, int], dict[int, list[float]]] = defaultdict(dict)
    prefill: dict[tuple[int | None, int], list[float]] = defaultdict(list)
    context: dict[tuple[int | None, int], list[ContextCost]] = defaultdict(list)
    measured, growth = _prefill_figures(session), _context_figures(session)
    views = [v for v in deployments.views(session) if v.verifier_name == verifier and v.step_s]
    for view in with_shared_steps(views):
        key = (vocab.get(view.draft), view.k or 0) if view.draft else (None, 0)
        for batch, seconds in view.step_s.items():
            pooled[key].setdefault(batch, []).append(seconds)
        if (figure := measured.get((view.name, view.draft or "none", view.k or 0))) is not None:
            prefill[key].append(figure)
        if (cost := growth.get((view.name, view.draft or "none", view.k or 0))) is not None:
            context[key].append(cost)
    curves = {key: {b: sum(v) / len(v) for b, v in sorted(points.items())} for key, points in pooled.items()}
    return Inputs(offline=offline, offline_samples=samples, live=live, curves=curves, calibrated=bool(curves),
                  prefill={key: sum(v) / len(v) for key, v in prefill.items()},
                  context={key: mean_context_cost(v) for key, v in context.items()}, **settings)


def _prefill_figures(session: Session) -> dict[tuple[str, str, int], float]:
    """(deployment, draft, k) -> seconds per prompt token, from the newest calibration that measured it."""
    out: dict[tuple[str, str, int], float] = {}
    for point in calibrations.latest(session):
        if (figure := _number(point.details.get("prefill_s_per_token"), 0.0, 1.0)) is not None and figure > 0:
            out[(point.deployment, point.draft_name, point.k)] = figure
    return out


def _number(value: Any, low: float, high: float) -> float | None:
    """A calibration detail that is a real number in [low, high), else None (a hand-edited or foreign row)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value < high:
        return float(value)
    return None


def context_of(details: Mapping[str, Any]) -> ContextCost | None:
    """A calibration point's figures on how a request's shape changes its cost, or None when it lacks the step's
    growth per context token (below 10 ms a token) or the context it was measured at (under a million tokens).
    Calibrations of short raw prompts have no ``prompt_tokens``: their step holds no prompt and spreads no
    per-request cost."""
    slope = _number(details.get("step_s_per_context_token"), 0.0, 0.01)
    at = _number(details.get("context_tokens"), 0.0, 1e6)
    if slope is None or at is None:
        return None
    prompt = _number(details.get("prompt_tokens"), 0.0, 1e6)
    overhead = _number(details.get("overhead_s"), 0.0, 60.0)
    answer = _number(details.get("max_tokens"), 1.0, 1e6)
    per_step = _number(details.get("tokens_per_step"), 1.0, 64.0)
    spread = (overhead or 0.0, answer / per_step) if prompt and answer and per_step else (0.0, 0.0)
    return ContextCost(slope, at, min(prompt or 0.0, at), *spread)


def _context_figures(session: Session) -> dict[tuple[str, str, int], ContextCost]:
    """(deployment, draft, k) -> ``context_of`` the newest calibration that has it."""
    out: dict[tuple[str, str, int], ContextCost] = {}
    for point in calibrations.latest(session):
        if (cost := context_of(point.details)) is not None:
            out[(point.deployment, point.draft_name, point.k)] = cost
    return out


def live_traffic(session: Session) -> list[Cell]:
    """The live statistics' mix: requests per (language, domain) over all drafts, as shares."""
    requests: dict[tuple[str, str], int] = defaultdict(int)
    for row in deployments.live_stats(session):
        if row.language not in (UNDETERMINED, "other") and row.requests > 0:
            requests[(row.language, row.domain)] += row.requests
    total = sum(requests.values())
    if not total:
        raise PlanError("no live traffic in the registry to plan for: give the mix with --traffic, "
                        "e.g. --traffic en=0.5,fr=0.3,ja=0.2")
    return [cell(lang, domain, n / total) for (lang, domain), n in sorted(requests.items())]


def default_traffic(session: Session, verifier: str) -> list[Cell]:
    """The mix `polyspec up --plan auto` plans for: the live statistics'; before any traffic, the active
    deployments' languages alike; before any deployment, the active drafts' languages alike."""
    try:
        return live_traffic(session)
    except PlanError:
        pass
    langs = sorted({lang for d in session.scalars(select(Deployment).where(Deployment.status == "active"))
                    for lang in (d.languages or (d.draft.languages if d.draft is not None else []))})
    if not langs:
        langs = sorted({lang for d in drafts_of(session, verifier).values() if d.status == "active"
                        for lang in d.languages if lang not in (UNDETERMINED, MULTILINGUAL)})
    if not langs:
        raise PlanError("nothing to plan for: no live traffic, no deployment and no active draft")
    return [cell(lang, "general", 1 / len(langs)) for lang in langs]


def make_plan(session: Session, *, engines: int, traffic: list[Cell] | None, verifier: str | None,
              default_verifier: str, **settings: Any) -> FleetPlan:
    """The plan for ``engines`` slots over ``traffic`` (else the live statistics' mix)."""
    name = plan_verifier(session, verifier, default_verifier)
    cells = traffic if traffic is not None else live_traffic(session)
    return plan_fleet(verifier=name, engines=engines, cells=cells, candidates=candidates(session, name),
                      inputs=gather(session, name, **settings))
