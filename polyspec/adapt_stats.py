"""The canary's statistics: is the candidate engine measurably worse than the engine it would replace?

Two one-sided tests on live counters (the registry's live stats, differenced over the canary):

- **Acceptance**: tokens per verify step, E = 1 + a_1 + ... + a_k, from the per-position counts. Its
  variance per step comes from the same counts (core.speed.step_variance); as in the speed model, each
  request counts as one sample (steps within an answer are correlated), which is conservative. An engine
  without speculation yields exactly one token per step (E = 1, no variance).
- **Tokens/s**: the ratio estimator R = sum(tokens) / sum(generation seconds) over the polls of the canary
  (each poll's new tokens and seconds is one sample), with its delta-method variance
  sum((t_i - R s_i)^2) / (n (n - 1) mean(s)^2).

Both use the normal approximation (z); with few polls it is optimistic, which is why the canary waits for
``canary_min_requests`` per arm and needs at least MIN_WINDOWS polls with traffic in each. A canary is rolled
back when either test finds it slower at level alpha; otherwise it is promoted: the gate already showed
it better offline, and the canary's job is to catch what offline cannot (a slow engine, a live mix that
differs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from polyspec.core.speed import expected_tokens, step_variance

MIN_WINDOWS = 3


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
    return _z_test("tokens_per_s", a[0], a[1], b[0], b[1])


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
    be lower)."""
    tests = [acceptance_test(cand, old), tps_test(cand, old)]
    worse = [t for t in tests if t.worse(alpha)]
    if worse:
        return Verdict("rollback", [f"candidate {t.metric} {t.candidate:.3f} vs {t.old:.3f}: worse at "
                                    f"p = {t.p_worse:.4f} < {alpha}" for t in worse], tests)
    short = [a.name for a in (cand, old) if a.requests < min_requests]
    if short:
        why = f"{', '.join(short)}: fewer than {min_requests} requests"
        return Verdict("rollback", [f"not enough canary traffic ({why})"], tests) if final else \
            Verdict("wait", [why], tests)
    undecided = [t for t in tests if t.p_worse is None]
    if undecided and not final:
        return Verdict("wait", [f"{t.metric}: {t.note}" for t in undecided], tests)
    lower = [t for t in undecided if t.candidate is None or t.old is None or t.candidate < t.old]
    if lower:
        return Verdict("rollback", [f"{t.metric}: no test possible ({t.note}) and the candidate is not higher "
                                    f"({_r(t.candidate)} vs {_r(t.old)})" for t in lower], tests)
    return Verdict("promote", [f"{t.metric}: candidate {_r(t.candidate)} vs old {_r(t.old)}"
                               + (f" (p = {t.p_worse:.3f})" if t.p_worse is not None else f" ({t.note})")
                               for t in tests], tests)
