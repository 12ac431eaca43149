"""The promotion gate: a candidate becomes active only when it measurably helps its target languages
and does not hurt the others.

Comparisons use evaluations of the same (benchmark, method, k, evaluation domain, answer subset): like with like,
so a figure over non-degenerate answers is never compared with one over all answers. The latest one per key for each
draft. Baseline for a target language: the best active draft of the same verifier and domain that
serves it; when none does, the candidate's parent if it was evaluated on that language (what served
it before, usually the default draft); when there is neither, the language has no baseline and passes on any evaluation.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from polyspec.registry.errors import PromotionRefused, RegistryError
from polyspec.registry.languages import normalize_languages
from polyspec.registry.records import PromotionResult
from polyspec.registry.schema import Draft, Event

# Defaults (see docs/registry.md): with ~80 prompts x ~200 tokens an evaluation has about 10^4
# speculative steps, so the standard error of a mean acceptance length is about 0.01.
DEFAULT_DELTA = 0.02  # required gain on each target language (about 2 standard errors)
DEFAULT_EPSILON = 0.02  # tolerated loss on any other evaluated language (the same noise band)
EvalKey = tuple[str, str, str, int, str, str]  # language, benchmark, method, k, evaluation domain, subset


def meets(change: float, must_gain: bool, delta: float, epsilon: float) -> bool:
    """The gate's rule for one comparison: a gain of at least ``delta`` where the gain is required, else a loss
    of at most ``epsilon`` (both with a float tolerance). The adaptation gate applies the same rule."""
    return change >= (delta if must_gain else -epsilon) - 1e-9


def _ref(d: Draft) -> str:
    return f"{d.name}@{d.version}"


def latest_evals(draft: Draft) -> dict[EvalKey, float]:
    out: dict[EvalKey, tuple[int, float]] = {}
    for ev in draft.evaluations:
        key = (ev.language, ev.benchmark, ev.method, ev.k, ev.domain, ev.subset or "all")
        if key not in out or ev.id > out[key][0]:
            out[key] = (ev.id, ev.mean_acceptance_length)
    return {k: v[1] for k, v in out.items()}


def _incumbents(session: Session, cand: Draft, targets: list[str]) -> list[Draft]:
    query = select(Draft).where(
        Draft.status == "active", Draft.verifier_id == cand.verifier_id, Draft.domain == cand.domain,
        Draft.id != cand.id)
    return [d for d in session.scalars(query) if set(d.languages or []) & set(targets)]


def _compare(cand_evals: dict[EvalKey, float], baselines: list[Draft], language: str) -> list[dict[str, Any]]:
    """One comparison per evaluation key the candidate shares with a baseline (best baseline wins)."""
    rows = []
    for key, after in sorted(cand_evals.items()):
        if key[0] != language:
            continue
        scored = [(latest_evals(b).get(key), _ref(b)) for b in baselines]
        scored = [(v, r) for v, r in scored if v is not None]
        if scored:
            before, ref = max(scored)
            rows.append({"language": language, "benchmark": key[1], "method": key[2], "k": key[3], "domain": key[4],
                         "subset": key[5], "baseline": ref, "before": round(before, 4), "after": round(after, 4),
                         "change": round(after - before, 4)})
    return rows


def evaluate_gate(
    session: Session, cand: Draft, targets: list[str], delta: float, epsilon: float,
    gain_on: Collection[str] | None = None,
) -> tuple[list[dict[str, Any]], list[str], list[Draft]]:
    """(comparisons, failures, incumbents) for promoting ``cand`` on ``targets``. ``gain_on``: the benchmarks
    on which a target language must gain ``delta`` (None: all); on its other benchmarks it must not lose more
    than ``epsilon``, as the other languages."""
    cand_evals = latest_evals(cand)
    incumbents = _incumbents(session, cand, targets)
    comparisons: list[dict[str, Any]] = []
    failures: list[str] = []
    used: dict[int, Draft] = {}
    for lang in targets:
        mine = {k: v for k, v in cand_evals.items() if k[0] == lang}
        if not mine:
            failures.append(f"{lang}: {_ref(cand)} has no evaluation for {lang}")
            continue
        baselines = [d for d in incumbents if lang in (d.languages or [])]
        if not baselines and cand.parent is not None and any(k[0] == lang for k in latest_evals(cand.parent)):
            baselines = [cand.parent]  # what served this language before, e.g. the English base
        if not baselines:
            comparisons.append({"language": lang, "baseline": None, "after": round(max(mine.values()), 4),
                                "note": "first draft for this language: no baseline", "passed": True})
            continue
        rows = _compare(cand_evals, baselines, lang)
        if not rows:
            names = ", ".join(_ref(b) for b in baselines)
            failures.append(f"{lang}: no evaluation comparable with {names} (same benchmark, method, k, domain and subset)")
            continue
        used.update({b.id: b for b in baselines})
        if gain_on is not None and not any(row["benchmark"] in gain_on for row in rows):
            failures.append(f"{lang}: no evaluation on {', '.join(sorted(gain_on))} comparable with a baseline, "
                            "where the gain is required")
        for row in rows:
            must_gain = gain_on is None or row["benchmark"] in gain_on
            row["required"] = "gain" if must_gain else "no loss"
            row["passed"] = meets(row["change"], must_gain, delta, epsilon)
            comparisons.append(row)
            if not row["passed"]:
                where = (f"{row['before']:.3f} -> {row['after']:.3f} on {row['benchmark']}/{row['method']}/k={row['k']}"
                         f"/{row['subset']} (vs {row['baseline']})")
                failures.append(f"{lang}: mean acceptance length {where}, gain {row['change']:+.3f} < {delta}"
                                if must_gain else f"{lang}: mean acceptance length fell {where}, more than {epsilon}")
    for lang in sorted({k[0] for k in cand_evals} - set(targets)):
        for row in _compare(cand_evals, list(used.values()), lang):
            row["required"] = "no loss"
            row["passed"] = meets(row["change"], False, delta, epsilon)
            comparisons.append(row)
            if not row["passed"]:
                failures.append(
                    f"{lang}: mean acceptance length fell {row['before']:.3f} -> {row['after']:.3f} on "
                    f"{row['benchmark']}/{row['method']}/k={row['k']}/{row['subset']} (vs {row['baseline']}), more than {epsilon}")
    return comparisons, failures, incumbents


def promote(
    session: Session, cand: Draft, *, languages: list[str] | str | None = None, delta: float = DEFAULT_DELTA,
    epsilon: float = DEFAULT_EPSILON, force: bool = False, replace: bool = False,
    gain_on: Collection[str] | None = None,
) -> PromotionResult:
    """Make ``cand`` active if it passes the gate (or ``force``). ``replace`` retires the active drafts it
    supersedes (same verifier and domain, all their languages among the targets) and moves their
    locally launched deployments to it. ``gain_on`` limits the required gain to those benchmarks (see
    ``evaluate_gate``)."""
    if cand.status == "active":
        raise RegistryError(f"{_ref(cand)} is already active")
    if delta < 0 or epsilon < 0:
        raise RegistryError("delta and epsilon must not be negative")
    if gain_on is not None:
        gain_on = sorted({str(b).strip() for b in gain_on})
        if not gain_on or "" in gain_on:
            raise RegistryError("gain_on names no benchmark (or an empty one); leave it out to require the gain on all")
    targets = normalize_languages(languages) if languages else list(cand.languages or [])
    if not targets:
        raise RegistryError(f"{_ref(cand)} has no target language")
    comparisons, failures, incumbents = evaluate_gate(session, cand, targets, delta, epsilon, gain_on)
    if failures and not force:
        raise PromotionRefused(f"promotion of {_ref(cand)} refused: " + "; ".join(failures), failures)
    retired, moved = _replace(session, cand, incumbents, targets) if replace else ([], [])
    cand.status = "active"
    kind = "promote-forced" if failures else "promote"
    session.add(Event(kind=kind, subject=_ref(cand), details={
        "languages": targets, "delta": delta, "epsilon": epsilon, "gain_on": gain_on, "comparisons": comparisons,
        "failures": failures, "retired": retired, "repointed_deployments": moved}))
    session.flush()
    return PromotionResult(draft=_ref(cand), languages=targets, passed=not failures, forced=bool(failures),
                           comparisons=comparisons, failures=failures, retired=retired, repointed_deployments=moved)


def _replace(session: Session, cand: Draft, incumbents: list[Draft], targets: list[str]) -> tuple[list[str], list[str]]:
    superseded = [d for d in incumbents if set(d.languages or []) <= set(targets)]
    retired: list[str] = []
    moved: list[str] = []
    for old in superseded:
        live = [dep for dep in old.deployments if dep.status == "active"]
        remote = [dep.name for dep in live if dep.url]
        if remote:
            raise RegistryError(
                f"cannot replace {_ref(old)}: remote deployment(s) {', '.join(remote)} run it at a fixed URL; "
                "undeploy them, or redeploy with the new draft, first")
        for dep in live:
            dep.draft = cand
            moved.append(dep.name)
        old.status = "retired"
        retired.append(_ref(old))
    session.flush()
    return retired, moved
