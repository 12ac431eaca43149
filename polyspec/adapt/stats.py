"""The canary's statistics: is the candidate engine measurably worse than the engine it would replace?

Two one-sided tests on live counters (the registry's live stats, differenced over the canary):

- **Acceptance**: tokens per verify step, E = 1 + a_1 + ... + a_k, from the per-position counts. Its
  variance per step comes from the same counts (core.speed.step_variance); as in the speed model, each
  request counts as one sample (steps within an answer are correlated), which is conservative. An engine
  without speculation yields exactly one token per step (E = 1, no variance).
- **Tokens/s**: the ratio estimator R = sum(tokens) / sum(generation seconds) over the polls of the canary
  (each poll's new tokens and seconds is one sample), with its delta-method variance
  sum((t_i - R s_i)^2) / (n (n - 1) mean(s)^2).

The acceptance test uses the normal approximation (z): its variance comes from the counts, not from a
handful of samples. The tokens/s test estimates its variance from the polls themselves, so it is Welch's
t-test (Welch-Satterthwaite degrees of freedom from each arm's polls): with three polls a z-test is
badly optimistic (z = -2.1 reads p = 0.018 where t with 2 degrees of freedom gives 0.085; a CI run rolled
back a candidate on that, whose acceptance test read p = 0.16).

The canary looks at its figures every poll. Testing at alpha at every look would roll back a candidate as
good as the old engine far more often than alpha, so the looks follow Haybittle-Peto: the decision look
(the first poll with ``canary_min_requests`` per arm and every test possible, or the deadline) tests at
alpha; the looks before it roll back only at INTERIM_ALPHA, for a candidate that is plainly worse. A
candidate not worse at the decision look is promoted: the gate already showed it better offline, and the
canary's job is to catch what offline cannot (a slow engine, a live mix that differs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from mpmath import betainc

from polyspec.core.speed import expected_tokens, step_variance

MIN_WINDOWS = 3
INTERIM_ALPHA = 0.001  # Haybittle-Peto's boundary for the looks before the decision look


@dataclass
class Arm:
    """Live counters of one side of the canary over its duration."""

    name: str
    requests: int = 0
    completion_tokens: int = 0
    generation_s: float = 0.0
    spec_steps: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    speculates: bool = True
    windows: list[tuple[int, float]] = field(default_factory=list)  # (tokens, seconds) per poll with traffic

    @property
    def tps(self) -> float | None:
        return self.completion_tokens / self.generation_s if self.generation_s > 0 else None

    @property
    def acceptance(self) -> list[float]:
        return [n / self.spec_steps for n in self.accepted_per_pos] if self.spec_steps else []

    @property
    def tokens_per_step(self) -> float | None:
        if not self.speculates:
            return 1.0
        return expected_tokens(self.acceptance, len(self.acceptance)) if self.spec_steps else None

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "requests": self.requests, "completion_tokens": self.completion_tokens,
                "generation_s": round(self.generation_s, 3), "tokens_per_s": _r(self.tps),
                "tokens_per_step": _r(self.tokens_per_step), "spec_steps": self.spec_steps,
                "windows": len(self.windows)}


@dataclass
class Test:
    metric: str
    candidate: float | None
    old: float | None
    z: float | None
    p_worse: float | None  # one-sided p-value of "the candidate is no worse"; small: it is worse
    note: str = ""

    def worse(self, alpha: float) -> bool:
        return self.p_worse is not None and self.p_worse < alpha

    def to_json(self) -> dict[str, object]:
        return {"metric": self.metric, "candidate": _r(self.candidate), "old": _r(self.old), "z": _r(self.z),
                "p_worse": _r(self.p_worse, 5), "note": self.note}


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _z_test(metric: str, a: float, var_a: float, b: float, var_b: float) -> Test:
    spread = math.sqrt(var_a + var_b)
    if spread <= 1e-9 * max(abs(a), abs(b), 1.0):  # float noise of identical polls is no variance
        p = 0.0 if a < b else 1.0
        return Test(metric, a, b, None, p, "no variance: compared as they are")
    z = (a - b) / spread
    return Test(metric, a, b, z, NormalDist().cdf(z))


def student_t_cdf(t: float, dof: float) -> float:
    """P(T <= t) for Student's t with ``dof`` (real, > 0) degrees of freedom, via the regularized incomplete beta."""
    tail = 0.5 * float(betainc(dof / 2, 0.5, 0, dof / (dof + t * t), regularized=True))
    return tail if t < 0 else 1.0 - tail


def _welch_test(metric: str, a: tuple[float, float, int], b: tuple[float, float, int]) -> Test:
    """One-sided Welch test of (estimate, variance of the estimate, samples) a against b."""
    (ra, va, na), (rb, vb, nb) = a, b
    spread = math.sqrt(va + vb)
    if spread <= 1e-9 * max(abs(ra), abs(rb), 1.0):  # float noise of identical polls is no variance
        return Test(metric, ra, rb, None, 0.0 if ra < rb else 1.0, "no variance: compared as they are")
    dof = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))  # Welch-Satterthwaite
    t = (ra - rb) / spread
    return Test(metric, ra, rb, t, student_t_cdf(t, dof), f"Welch t, {dof:.1f} degrees of freedom")


def acceptance_test(cand: Arm, old: Arm) -> Test:
    """Tokens per verify step of the candidate against the old engine's."""
    ea, eb = cand.tokens_per_step, old.tokens_per_step
    if ea is None or eb is None or cand.requests < 1 or old.requests < 1:
        return Test("tokens_per_step", ea, eb, None, None, "no speculative steps measured on one side")
    var_a = step_variance(cand.acceptance, len(cand.acceptance)) / cand.requests if cand.speculates else 0.0
    var_b = step_variance(old.acceptance, len(old.acceptance)) / old.requests if old.speculates else 0.0
    return _z_test("tokens_per_step", ea, var_a, eb, var_b)


def ratio_variance(windows: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """(R, var R) of tokens/s over polls; None with fewer than MIN_WINDOWS polls or no time."""
    samples = [(float(t), float(s)) for t, s in windows if s > 0]
    n = len(samples)
    if n < MIN_WINDOWS:
        return None
    tokens, seconds = sum(t for t, _ in samples), sum(s for _, s in samples)
    ratio = tokens / seconds
    mean_s = seconds / n
    var = sum((t - ratio * s) ** 2 for t, s in samples) / (n * (n - 1) * mean_s**2)
    return ratio, var


def tps_test(cand: Arm, old: Arm) -> Test:
    """Observed tokens/s of the candidate against the old engine's (per-stream, as the router measures it)."""
    a, b = ratio_variance(cand.windows), ratio_variance(old.windows)
    if a is None or b is None:
        return Test("tokens_per_s", cand.tps, old.tps, None, None,
                    f"fewer than {MIN_WINDOWS} polls with traffic on one side")
    return _welch_test("tokens_per_s", (*a, _polls(cand.windows)), (*b, _polls(old.windows)))


def _polls(windows: Sequence[tuple[int, float]]) -> int:
    return sum(1 for _, s in windows if s > 0)


@dataclass
class Verdict:
    decision: str  # promote | rollback | wait
    reasons: list[str]
    tests: list[Test]

    def to_json(self) -> dict[str, object]:
        return {"decision": self.decision, "reasons": self.reasons, "tests": [t.to_json() for t in self.tests]}


def verdict(cand: Arm, old: Arm, *, alpha: float, min_requests: int, final: bool) -> Verdict:
    """promote, rollback, or wait for more traffic. ``final``: the canary's time is up. Then too little traffic
    rolls back, and a test without enough polls falls back to its point estimates (the candidate must not
    be lower). Before the decision look (enough requests on both arms, every test possible) only a test
    worse at INTERIM_ALPHA rolls back (Haybittle-Peto; the module's docstring says why)."""
    tests = [acceptance_test(cand, old), tps_test(cand, old)]
    short = [a.name for a in (cand, old) if a.requests < min_requests]
    undecided = [t for t in tests if t.p_worse is None]
    level = alpha if final or not (short or undecided) else min(alpha, INTERIM_ALPHA)
    worse = [t for t in tests if t.worse(level)]
    if worse:
        look = "" if level == alpha else " (an early look)"
        return Verdict("rollback", [f"candidate {t.metric} {t.candidate:.3f} vs {t.old:.3f}: worse at "
                                    f"p = {t.p_worse:.4f} < {level}{look}" for t in worse], tests)
    if short:
        why = f"{', '.join(short)}: fewer than {min_requests} requests"
        return Verdict("rollback", [f"not enough canary traffic ({why})"], tests) if final else \
            Verdict("wait", [why], tests)
    if undecided and not final:
        return Verdict("wait", [f"{t.metric}: {t.note}" for t in undecided], tests)
    lower = [t for t in undecided if t.candidate is None or t.old is None or t.candidate < t.old]
    if lower:
        return Verdict("rollback", [f"{t.metric}: no test possible ({t.note}) and the candidate is not higher "
                                    f"({_r(t.candidate)} vs {_r(t.old)})" for t in lower], tests)
    return Verdict("promote", [f"{t.metric}: candidate {_r(t.candidate)} vs old {_r(t.old)}"
                               + (f" (p = {t.p_worse:.3f})" if t.p_worse is not None else f" ({t.note})")
                               for t in tests], tests)
