"""`polyspec deploy plan`: what the speed model (core.speed) says about the fleet as deployed.

For each language of the traffic (live stats; the deployments' languages when there is none yet), every
calibrated deployment is an option with a predicted tokens/s at batch 1; the plan says which is fastest,
whether that is no speculation, and whether the language needs a draft of its own. For each draft
deployment it finds the k that maximises predicted tokens/s over the traffic it would serve (its
``k: auto``), with step time modelled as linear in k between the verifier alone (k = 0) and the
deployment's calibrated k:

    step(k) = step_plain + (step_k0 - step_plain) * k / k0

(draft passes grow with k; the verify pass over k + 1 tokens hardly grows on small batches, so this
over-states long k: a conservative choice). Recommendations ("train a draft for it", "serve it without
speculation", "run X with k = 2") are stored as open rows that `polyspec adapt` and operators act on.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from polyspec.core.languages import UNDETERMINED
from polyspec.core.speed import AcceptanceEstimate, blend_acceptance, interpolate, shared_curves, tokens_per_second
from polyspec.registry.deployments import add_lists
from polyspec.registry.records import DeploymentView, LiveStatRecord
from polyspec.registry.schema import Event, Recommendation

MAX_K = 8
PRIOR_SPEC_STEPS = 2000  # as the router's default (RouterConfig.prior_spec_steps)


@dataclass
class Option:
    deployment: str
    draft: str  # "none" without speculation
    k: int
    expected: float  # tokens per step
    step_s: float
    tps: float


@dataclass
class LanguagePlan:
    language: str
    requests: int
    share: float
    options: list[Option]  # fastest first
    best: Option | None
    plain_tps: float | None  # the fastest deployment without speculation
    speedup: float | None  # best over plain
    advice: str


@dataclass
class KPlan:
    deployment: str
    draft: str
    k: int
    best_k: int | None
    tps_by_k: dict[int, float] = field(default_factory=dict)  # traffic-weighted predicted tokens/s
    languages: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Plan:
    languages: list[LanguagePlan]
    k: list[KPlan]
    recommendations: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _estimate(dep: DeploymentView, language: str, live: dict[tuple[str, str], LiveStatRecord]) -> AcceptanceEstimate:
    row = live.get((language, dep.draft or "none"))
    est = blend_acceptance(dep.offline_acceptance.get(language), dep.offline_samples.get(language, 0),
                           PRIOR_SPEC_STEPS, row.accepted_per_pos if row else (), row.num_spec_steps if row else 0,
                           row.requests if row else 0)
    return est or AcceptanceEstimate((), 0.0, 0)


def per_language(stats: list[LiveStatRecord]) -> dict[tuple[str, str], LiveStatRecord]:
    """Live rows summed over domains, per (language, draft): the plan is per language."""
    out: dict[tuple[str, str], LiveStatRecord] = {}
    for row in stats:
        key = (row.language, row.draft_name)
        have = out.get(key)
        out[key] = row if have is None else have.model_copy(update={
            "requests": have.requests + row.requests, "num_spec_steps": have.num_spec_steps + row.num_spec_steps,
            "accepted_per_pos": add_lists(have.accepted_per_pos, row.accepted_per_pos)})
    return out


def with_shared_steps(deployments: list[DeploymentView]) -> list[DeploymentView]:
    """The deployments with each step curve replaced by its engine shape's (core.speed.shared_curves), as the
    router reads them: engines of one shape would otherwise be told apart by calibration noise."""
    shared = shared_curves({d.name: (d.step_shape, d.step_s) for d in deployments})
    return [d.model_copy(update={"step_s": shared[d.name]}) for d in deployments]


def _traffic(deployments: list[DeploymentView], stats: list[LiveStatRecord]) -> dict[str, int]:
    requests: dict[str, int] = defaultdict(int)
    for row in stats:
        if row.language not in (UNDETERMINED, "other"):
            requests[row.language] += row.requests
    if not requests:  # no traffic yet: the languages the deployments serve, alike
        for dep in deployments:
            for lang in dep.languages:
                requests[lang] += 0
    return dict(requests)


def _plain_step(deployments: list[DeploymentView]) -> float | None:
    steps = [dep.step_s[min(dep.step_s)] for dep in deployments if dep.draft is None and dep.step_s]
    return min(steps) if steps else None


def language_plans(deployments: list[DeploymentView], stats: list[LiveStatRecord], *, min_share: float,
                   min_speedup: float) -> list[LanguagePlan]:
    live = per_language(stats)
    requests = _traffic(deployments, stats)
    total = sum(requests.values())
    plans = []
    for lang, n in sorted(requests.items(), key=lambda kv: (-kv[1], kv[0])):
        options = []
        for dep in deployments:
            step = interpolate(dep.step_s, 1)
            if step is None:
                continue
            k = (dep.k or 0) if dep.draft else 0
            expected = _estimate(dep, lang, live).mean(k) if dep.draft else 1.0
            options.append(Option(dep.name, dep.draft or "none", k, round(expected, 4), step,
                                  round(tokens_per_second(expected, step) or 0.0, 3)))
        options.sort(key=lambda o: -o.tps)
        best = options[0] if options else None
        plain = max((o.tps for o in options if o.draft == "none"), default=None)
        speedup = round(best.tps / plain, 3) if best and plain else None
        share = n / total if total else 0.0
        own = any(lang in dep.languages and dep.draft for dep in deployments)
        if best is None:
            advice = "no calibrated deployment: run `polyspec engines calibrate`"
        elif best.draft == "none":
            advice = "serve without speculation" + ("" if own else "; train a draft for it")
        elif speedup is not None and speedup < min_speedup and not own:
            advice = f"speculation gains only {speedup:.2f}x; train a draft for it"
        else:
            advice = f"serve with {best.deployment}"
        if not own and share < min_share and "train a draft" in advice:
            advice = advice.replace("; train a draft for it", f"; too little traffic ({share:.0%}) for a draft")
        plans.append(LanguagePlan(lang, n, round(share, 4), options, best, plain, speedup, advice))
    return plans


def k_plans(deployments: list[DeploymentView], languages: list[LanguagePlan], stats: list[LiveStatRecord]) -> list[KPlan]:
    """The k that maximises each draft deployment's predicted tokens/s over the languages it serves best."""
    plain = _plain_step(deployments)
    live = per_language(stats)
    served: dict[str, list[LanguagePlan]] = defaultdict(list)
    for lp in languages:
        if lp.best is not None:
            served[lp.best.deployment].append(lp)
    out = []
    for dep in deployments:
        if not dep.draft:
            continue
        k0 = dep.k or 3
        mix = served.get(dep.name) or [lp for lp in languages if lp.language in dep.languages]
        kp = KPlan(dep.name, dep.draft, k0, None, languages=[lp.language for lp in mix])
        step0 = interpolate(dep.step_s, 1)
        if step0 is None or plain is None or not mix:
            kp.note = ("calibrate this deployment and one without speculation" if step0 is None or plain is None
                       else "no traffic to plan for")
            out.append(kp)
            continue
        weights = [max(lp.requests, 1) for lp in mix]
        for k in range(1, MAX_K + 1):
            step = plain + (step0 - plain) * k / k0
            tps = sum(w * _estimate(dep, lp.language, live).mean(k) / step for w, lp in zip(weights, mix, strict=True))
            kp.tps_by_k[k] = round(tps / sum(weights), 3)
        kp.best_k = max(kp.tps_by_k, key=lambda k: kp.tps_by_k[k])
        out.append(kp)
    return out


def recommendations(languages: list[LanguagePlan], ks: list[KPlan], *, min_share: float,
                    min_k_gain: float) -> list[dict[str, Any]]:
    recs = []
    for lp in languages:
        figures = {"share": lp.share, "requests": lp.requests, "best": lp.best.deployment if lp.best else None,
                   "best_tps": lp.best.tps if lp.best else None, "plain_tps": lp.plain_tps, "speedup": lp.speedup}
        if "train a draft" in lp.advice and lp.share >= min_share:
            recs.append({"kind": "train-draft", "subject": lp.language, "details": {**figures, "why": lp.advice}})
        if lp.best is not None and lp.best.draft == "none":
            recs.append({"kind": "no-speculation", "subject": lp.language, "details": figures})
    for kp in ks:
        if kp.best_k is not None and kp.best_k != kp.k:
            gain = kp.tps_by_k[kp.best_k] / kp.tps_by_k[kp.k] if kp.tps_by_k.get(kp.k) else None
            if gain is not None and gain >= min_k_gain:
                recs.append({"kind": "change-k", "subject": kp.deployment, "details": {
                    "k": kp.k, "best_k": kp.best_k, "gain": round(gain, 3), "tps_by_k": kp.tps_by_k,
                    "languages": kp.languages}})
    return recs


def store(session: Session, recs: list[dict[str, Any]]) -> int:
    """Upsert open recommendations (one open row per kind and subject); returns how many are new."""
    new = 0
    for rec in recs:
        row = session.scalars(select(Recommendation).where(
            Recommendation.kind == rec["kind"], Recommendation.subject == rec["subject"],
            Recommendation.status == "open")).first()
        if row is None:
            session.add(Recommendation(kind=rec["kind"], subject=rec["subject"], status="open", details=rec["details"]))
            session.add(Event(kind="recommend", subject=rec["subject"], details={"recommendation": rec["kind"],
                                                                                  **rec["details"]}))
            new += 1
        else:
            row.details = rec["details"]
    session.flush()
    return new


def open_recommendations(session: Session, kind: str | None = None) -> list[dict[str, Any]]:
    query = select(Recommendation).where(Recommendation.status == "open").order_by(Recommendation.id)
    if kind is not None:
        query = query.where(Recommendation.kind == kind)
    return [{"id": r.id, "kind": r.kind, "subject": r.subject, "details": dict(r.details or {}),
             "created_at": r.created_at.isoformat() if r.created_at else None} for r in session.scalars(query)]
