"""The adaptation gate: the candidate must beat the draft serving its language on the held-out live set (the
traffic it is trained for), over all answers and over non-degenerate answers, by ``gate_delta``; and it must not
lose more than ``gate_margin`` on any MT-Bench file: its own language's, English's and every other served
language's. Its language is compared with the draft serving it, the others with the same draft (or the
candidate's parent, when the language was served without speculation).

Measured with `polyspec eval`'s offline path (training.eval_api): teacher-forced on the verifier's own greedy
answers, every draft on the same answers, so differences are paired. Where the language was served without
speculation, the baseline is 1.0 token per step (the verifier alone). Every figure is stored as a registry
evaluation (so `polyspec registry promote --gain-on live-...` re-checks the same keys at the swap) and in the
``adapt-gate`` event; a failed gate changes nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyspec.adapt.settings import AdaptSettings
from polyspec.models.verifiers import resolve_verifier
from polyspec.registry.promotion import meets
from polyspec.training.benchmarks import mtbench_languages
from polyspec.training.eval_api import EvalOptions, run_eval
from polyspec.training.eval_options import DraftChoice


@dataclass
class GateResult:
    passed: bool
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    evaluations: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "comparisons": self.comparisons, "failures": self.failures,
                "evaluations": self.evaluations}


@dataclass
class Bench:
    spec: str  # file path or mtbench:LANG
    name: str  # as recorded in the registry
    language: str
    target: bool  # the candidate's language: compared with the draft serving it
    gain: bool = False  # must gain gate_delta (the live set); else must not lose more than gate_margin
    limit: int | None = None  # questions; None: the whole file


def live_benchmark(language: str, heldout_sha: str) -> str:
    """The registry name of a language's held-out live set: the benchmark the candidate must gain on."""
    return f"live-{language}-{heldout_sha[:8]}"


def gain_benchmarks(candidate: Any, language: str) -> list[str] | None:
    """What the promotion at the swap requires a gain on: the live set the gate measured, from the candidate's
    provenance; None (a gain on every benchmark of the language) for a draft that adapt did not train."""
    dataset = (candidate.provenance or {}).get("adapt", {}).get("dataset") or {}
    sha = dataset.get("heldout_sha256")
    return [live_benchmark(language, sha)] if isinstance(sha, str) and sha else None


def benches(language: str, heldout: Path, heldout_sha: str, served: list[str], s: AdaptSettings) -> list[Bench]:
    bundled = set(mtbench_languages())
    # The whole held-out live set (at most max_heldout prompts): besides gating, it becomes the candidate's offline
    # figure with the most prompts, which the speed policy reads (registry.deployments) until live traffic takes over.
    out = [Bench(str(heldout), live_benchmark(language, heldout_sha), language, True, gain=True)]
    n = s.gate_questions
    if language in bundled:
        out.append(Bench(f"mtbench:{language}", f"mtbench-{n}", language, True, limit=n))
    for other in sorted(({"en", *served} & bundled) - {language}):
        out.append(Bench(f"mtbench:{other}", f"mtbench-{n}", other, False, limit=n))
    return out


def _measure(bench: Bench, drafts: list[Any], verifier: Any, k: int, s: AdaptSettings) -> list[Any]:
    options = EvalOptions(benchmark=bench.spec, k=k, turns="1", max_new_tokens=s.gate_tokens,
                          limit=bench.limit, language=bench.language, device=None if s.device == "auto" else s.device,
                          progress=False)
    return run_eval(drafts, verifier, options).rows


def compare(rows: list[Any], bench: Bench, baseline: str | None, delta: float, margin: float) -> list[dict[str, Any]]:
    """One comparison per answer subset of the candidate against ``baseline`` (None: no speculation, 1.0)."""
    out = []
    by = {(r.draft, r.subset): r for r in rows if r.language == bench.language}
    for subset in ("all", "non_degenerate"):
        cand = by.get(("candidate", subset))
        base = by.get((baseline, subset)) if baseline else None
        after = cand.mean_acceptance_length if cand else None
        before = base.mean_acceptance_length if base else (1.0 if baseline is None else None)
        row = {"benchmark": bench.name, "language": bench.language, "subset": subset, "target": bench.target,
               "required": "gain" if bench.gain else "no loss",
               "baseline": baseline or "no speculation", "before": _r(before), "after": _r(after),
               "answers": cand.num_prompts if cand else 0, "degenerate_share": _r(cand.degenerate_share) if cand else None}
        if after is None or before is None:
            row.update(passed=True, change=None, note="no answers in this subset: not compared")
        else:
            row["change"] = round(after - before, 4)
            row["passed"] = meets(row["change"], bench.gain, delta, margin)
        out.append(row)
    return out


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def failure_text(row: dict[str, Any], delta: float, margin: float) -> str:
    need = f"a gain of {delta}" if row["required"] == "gain" else f"a loss of at most {margin}"
    return (f"{row['language']} {row['benchmark']} ({row['subset']}): {row['before']} -> {row['after']} against "
            f"{row['baseline']}, change {row['change']:+.4f}; needs {need}")


def run_gate(reg: Any, candidate: Any, baseline: Any | None, reference: Any | None, language: str,
             heldout: Path, heldout_sha: str, served: list[str], s: AdaptSettings) -> GateResult:
    """Measure and decide. ``baseline``: the draft serving the language (None: served without speculation);
    ``reference``: the draft the other languages are compared with (the baseline, else the parent)."""
    verifier = resolve_verifier(reg.get_verifier(candidate.verifier).location)
    if reference is not None and baseline is not None and reference.ref == baseline.ref:
        reference = None  # the same draft: measured once, as the baseline
    roles = {"candidate": candidate, "baseline": baseline, "reference": reference}
    drafts = [DraftChoice(role, Path(rec.location), registry_ref=rec.ref) for role, rec in roles.items() if rec]
    result = GateResult(True)
    for bench in benches(language, heldout, heldout_sha, served, s):
        against = "baseline" if bench.target or reference is None else "reference"
        if roles[against] is None:
            against = None
        if not bench.target and against is None:
            result.comparisons.append({"benchmark": bench.name, "language": bench.language, "passed": True,
                                       "note": "no draft to compare with: not checked"})
            continue
        rows = _measure(bench, drafts, verifier, int(candidate.k), s)
        result.evaluations += _record(reg, rows, roles, bench, heldout_sha)
        for row in compare(rows, bench, against, s.gate_delta, s.gate_margin):
            if against:
                row["baseline"] = roles[against].ref
            result.comparisons.append(row)
            if not row["passed"]:
                result.failures.append(failure_text(row, s.gate_delta, s.gate_margin))
    result.passed = not result.failures
    return result


def _record(reg: Any, rows: list[Any], roles: dict[str, Any], bench: Bench, heldout_sha: str) -> int:
    """Store the figures as registry evaluations of each draft (both subsets)."""
    n = 0
    for r in rows:
        rec = roles.get(r.draft)
        if rec is None or r.mean_acceptance_length is None or r.language != bench.language:
            continue
        reg.add_evaluation(rec.ref, benchmark=bench.name, language=r.language, k=r.k, acceptance=r.acceptance,
                           mean_acceptance_length=r.mean_acceptance_length, num_prompts=r.num_prompts,
                           num_tokens=r.num_tokens, method="offline", subset=r.subset,
                           degenerate_share=r.degenerate_share,
                           details={"histogram": r.histogram, "num_spec_steps": r.num_spec_steps, "gate": True,
                                    "file": bench.spec, **({"sha256": heldout_sha} if bench.target else {})})
        n += 1
    return n
