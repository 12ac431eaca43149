"""The speed model: predicted tokens per second of one stream on one engine, from acceptance and step cost.

One verify step of an engine that drafts k tokens yields ``E_k`` tokens on average,

    E_k = 1 + a_1 + a_2 + ... + a_k          (a_i = P(at least i drafts accepted), core.acceptance)

and takes ``step_s(b)`` seconds when the engine runs ``b`` streams at once. So one stream gets

    tokens/s = E_k / step_s(b)

An engine without speculation is the case k = 0: ``E = 1`` and ``step_s(b)`` is its time per token. Step
times come from a calibration (`polyspec engines calibrate`: requests at several batch sizes, wall time per
step, prefill included, so the figure is what a client sees) refreshed by what the router measures live.

Acceptance is uncertain; the policy ranks by a lower confidence bound of E (``AcceptanceEstimate.lower``)
so that a draft with few samples does not win on luck. The bound treats each request (or offline prompt)
as one sample of the per-step variance, which overstates the error when requests are long: a
conservative choice, stated in docs/speed.md with the model's other limits.

Pure arithmetic, no I/O: the router, the registry and the benchmarks share it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """Tokens per verify step at ``k`` drafted tokens, from per-position rates measured at some k'.

    Positions beyond the measured ones are extrapolated geometrically with the last measured conditional
    rate a_k'/a_(k'-1) (acceptance stops at the first rejection, so each further position is at most as
    likely as the one before it)."""
    if k <= 0:
        return 1.0
    rates = [min(1.0, max(0.0, float(a))) for a in acceptance]
    for i in range(1, len(rates)):
        rates[i] = min(rates[i], rates[i - 1])  # P(>= i) never rises with i; clamp measurement noise
    if not rates:
        return 1.0
    if len(rates) < k:
        last, before = rates[-1], rates[-2] if len(rates) > 1 else 1.0
        ratio = last / before if before > 0 else 0.0
        while len(rates) < k:
            rates.append(rates[-1] * ratio)
    return 1.0 + sum(rates[:k])


def step_variance(acceptance: Sequence[float], k: int) -> float:
    """Variance of the tokens one step yields: X = accepted drafts, P(X >= i) = a_i, so
    E[X] = sum a_i and E[X^2] = sum (2i - 1) a_i."""
    rates = list(acceptance[:k])
    mean = sum(rates)
    second = sum((2 * i + 1) * a for i, a in enumerate(rates))
    return max(0.0, second - mean * mean)


@dataclass(frozen=True)
class AcceptanceEstimate:
    """Per-position acceptance of one (draft, language, domain) with the evidence behind it."""

    acceptance: tuple[float, ...]  # a_1..a_k'
    samples: float  # independent samples: live requests plus offline prompts (weighted)
    steps: int  # verify steps behind the live part (0: offline only)

    def mean(self, k: int) -> float:
        return expected_tokens(self.acceptance, k)

    def stderr(self, k: int) -> float:
        if self.samples <= 0:
            return math.inf
        return math.sqrt(step_variance(self.acceptance, k) / self.samples)

    def lower(self, k: int, z: float) -> float:
        """Lower confidence bound of E_k; never below 1 (a step always yields the verifier's token)."""
        spread = self.stderr(k)
        if math.isinf(spread):
            return 1.0
        return max(1.0, self.mean(k) - z * spread)


# An offline evaluation recorded without its prompt count (older records, hand-added figures) counts as this
# many prompts: few enough that live traffic soon outweighs it, but not zero, which would make its lower
# bound 1.0 (no better than no speculation) however good the figure.
UNKNOWN_OFFLINE_SAMPLES = 10


def blend_acceptance(
    offline: Sequence[float] | None, offline_samples: int, prior_steps: int,
    live_per_pos: Sequence[int] = (), live_steps: int = 0, live_requests: int = 0,
) -> AcceptanceEstimate | None:
    """Offline rates count as ``prior_steps`` steps of evidence; live steps take over as they accumulate
    (the same weighting as the MAL blend of router.decision.policy). None when there is neither."""
    live = [n / live_steps for n in live_per_pos] if live_steps > 0 else None
    if offline is None and live is None:
        return None
    if offline is not None and offline_samples <= 0:
        offline_samples = UNKNOWN_OFFLINE_SAMPLES
    if live is None:
        return AcceptanceEstimate(tuple(offline or ()), float(offline_samples), 0)
    if offline is None:
        return AcceptanceEstimate(tuple(live), float(live_requests), live_steps)
    width = max(len(offline), len(live))
    off = list(offline) + [0.0] * (width - len(offline))
    liv = list(live) + [0.0] * (width - len(live))
    w = prior_steps + live_steps
    rates = tuple((prior_steps * a + live_steps * b) / w if w else a for a, b in zip(off, liv, strict=True))
    return AcceptanceEstimate(rates, float(offline_samples + live_requests), live_steps)


def interpolate(points: Mapping[int, float], batch: float) -> float | None:
    """Step seconds at ``batch`` from measured (batch size -> seconds): linear between points, the nearest
    slope beyond them (never below the smallest measured time); None without points."""
    if not points:
        return None
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    if batch <= xs[0]:
        return points[xs[0]]
    for lo, hi in zip(xs, xs[1:], strict=False):
        if batch <= hi:
            t = (batch - lo) / (hi - lo)
            return points[lo] + t * (points[hi] - points[lo])
    lo, hi = xs[-2], xs[-1]
    slope = (points[hi] - points[lo]) / (hi - lo)
    return max(points[hi], points[hi] + slope * (batch - hi))


def shared_curves(curves: Mapping[str, tuple[str | None, Mapping[int, float]]]) -> dict[str, dict[int, float]]:
    """Engine name -> (its shape, its calibrated curve) to engine name -> the curve of its shape: at each batch
    size, the mean over the engines of that shape measured there. Engines of one shape (same host, verifier,
    k, draft vocabulary and speed knobs: registry.calibrations.engine_shape) have one true step time, and a
    few calibration requests per engine measure it with a noise wide enough to decide a routing on. An
    engine without a shape (None) keeps its own curve."""
    pooled: dict[str, dict[int, list[float]]] = {}
    for shape, curve in curves.values():
        if shape is not None:
            for batch, seconds in curve.items():
                pooled.setdefault(shape, {}).setdefault(batch, []).append(seconds)
    return {name: ({b: sum(v) / len(v) for b, v in sorted(pooled[shape].items())} if shape in pooled else dict(curve))
            for name, (shape, curve) in curves.items()}


def blend_step(calibrated: float | None, live: float | None, live_samples: int, prior_samples: int) -> float | None:
    """Calibrated step time as a prior of ``prior_samples`` requests; live measurements take over."""
    if calibrated is None:
        return live
    if live is None or live_samples <= 0:
        return calibrated
    return (prior_samples * calibrated + live_samples * live) / (prior_samples + live_samples)


def tokens_per_second(expected: float, step_s: float | None) -> float | None:
    if step_s is None or step_s <= 0:
        return None
    return expected / step_s


# Prefill, per prompt token, in steps of the verifier alone at batch 1 (a step without speculation). A step
# time from `polyspec engines calibrate` is wall time over steps for short raw prompts (16 tokens, no chat
# template): it hides almost no prefill. A chat request's prompt is 78-196 tokens (MT-Bench first turns with
# SmolLM2's template), and on the 2-core machine of docs/speed.md each prompt token cost 4.7-4.9 ms on the
# draft engines of every committed speed_policy run (least squares of request seconds on steps and prompt
# tokens; bench/prediction_gap.py), 0.076 of the verifier-alone step of the last run (63.4 ms). Left out, it
# made every prediction of that run 15-26 % too high, Russian (the longest prompts in tokens) the most.
PREFILL_STEPS_PER_TOKEN = 0.076


@dataclass(frozen=True)
class ContextCost:
    """How a request's cost depends on its shape, relative to the requests a step time was measured on:
    - a decode step grows by ``s_per_token`` seconds per token of context (attention over more tokens) from a step
      measured at a mean context of ``measured_at`` tokens (router.calibrate's ``step_s_per_context_token`` and
      ``context_tokens``);
    - that step already holds the prefill of a ``prompt_at``-token prompt (its ``prompt_tokens``: calibration's
      chat turns), so only the prompt tokens beyond it add prefill;
    - and it holds ``overhead_s`` of per-request cost (the fit's ``overhead_s``: the HTTP round trip, the first
      token, the chat request's own work), both spread over ``steps_at`` steps (calibration's answer length over
      its tokens per step), so a request of fewer steps pays the share those steps do not carry.
    The default adds nothing and counts every prompt token's prefill."""

    s_per_token: float = 0.0
    measured_at: float = 0.0
    prompt_at: float = 0.0
    overhead_s: float = 0.0
    steps_at: float = 0.0

    def step(self, step_s: float, context_tokens: float) -> float:
        """The step at a mean context of ``context_tokens``; never below half the measured step (a context
        shorter than calibration's saves at most what attention costs)."""
        return max(step_s / 2, step_s + self.s_per_token * (context_tokens - self.measured_at))

    def fixed_seconds(self, prompt_tokens: float, steps: float, prefill_s_per_token: float) -> float:
        """What a request of ``prompt_tokens`` and ``steps`` costs beyond its steps at the calibrated step: its
        prompt's prefill and the per-request overhead, less the share of calibration's that its steps already
        carry (``steps / steps_at`` of them; negative for a shorter prompt or a longer answer). Without
        ``steps_at``, the prefill of the prompt tokens beyond ``prompt_at``."""
        if self.steps_at <= 0:
            return (prompt_tokens - self.prompt_at) * prefill_s_per_token
        held = (self.prompt_at * prefill_s_per_token + self.overhead_s) * steps / self.steps_at
        return prompt_tokens * prefill_s_per_token + self.overhead_s - held


NO_CONTEXT_COST = ContextCost()


def mean_context_cost(costs: Sequence[ContextCost]) -> ContextCost:
    """The figures of several engines' calibrations averaged (engines of one shape, or the closest ones)."""
    if not costs:
        return NO_CONTEXT_COST
    n = len(costs)
    return ContextCost(*(sum(getattr(c, name) for c in costs) / n
                         for name in ("s_per_token", "measured_at", "prompt_at", "overhead_s", "steps_at")))


def request_seconds(expected: float, step_s: float, *, answer_tokens: int, prompt_tokens: int,
                    prefill_s_per_token: float, context: ContextCost = NO_CONTEXT_COST) -> float:
    """Wall time of one request: ``answer_tokens / expected`` steps, each at the request's mean context (the
    prompt and half the answer), and what its shape costs beyond them (``ContextCost.fixed_seconds``), never
    less than half the steps' time."""
    steps = answer_tokens / max(expected, 1.0)
    decode = steps * context.step(step_s, prompt_tokens + answer_tokens / 2)
    return max(decode / 2, decode + context.fixed_seconds(prompt_tokens, steps, prefill_s_per_token))


def request_tokens_per_second(expected: float, step_s: float | None, *, answer_tokens: int, prompt_tokens: int,
                              prefill_s_per_token: float, context: ContextCost = NO_CONTEXT_COST) -> float | None:
    """Tokens/s a client sees over a whole request (prefill included); ``tokens_per_second`` without a prompt."""
    if step_s is None or step_s <= 0 or answer_tokens <= 0:
        return None
    return answer_tokens / request_seconds(expected, step_s, answer_tokens=answer_tokens, prompt_tokens=prompt_tokens,
                                           prefill_s_per_token=prefill_s_per_token, context=context)


@dataclass(frozen=True)
class RequestCost:
    """One engine's cost of a request at batch 1, fitted by least squares over every calibration request
    (``fit_request_cost``): ``overhead_s`` per request whatever its length (the first token's pass, the HTTP round
    trip, the engine's stalls on a shared machine, on average), ``prefill_s_per_token`` per prompt token, and
    ``step_s`` per decode step at a mean context of ``context.measured_at`` tokens, growing by
    ``context.s_per_token`` per token of context."""

    overhead_s: float
    prefill_s_per_token: float
    step_s: float
    context: ContextCost
    requests: int

    def seconds(self, steps: float, prompt_tokens: float, answer_tokens: float) -> float:
        return (self.overhead_s + prompt_tokens * self.prefill_s_per_token
                + steps * self.context.step(self.step_s, prompt_tokens + answer_tokens / 2))


Sample = tuple[float, int, int, int]  # one request: (wall seconds, verify steps, completion tokens, prompt tokens)
MIN_FIT_REQUESTS = 8


def fit_request_cost(samples: Sequence[Sample], measured_at: float) -> RequestCost | None:
    """Least squares of wall time on [1, prompt tokens, steps, steps x (context - measured_at)] over one engine's
    requests at batch 1, every coefficient non-negative (the best fit over the subsets of the other three terms
    with the step term always in: exact non-negative least squares for four terms). A mean fit, not a median:
    what a client sees over many requests includes the slow ones. None with fewer than MIN_FIT_REQUESTS requests
    or when no fit has a positive step (requests that vary too little to tell the terms apart)."""
    if len(samples) < MIN_FIT_REQUESTS:
        return None
    rows = [(1.0, float(p), float(s), s * (p + t / 2 - measured_at)) for _, s, t, p in samples]
    walls = [w for w, *_ in samples]
    best: tuple[float, list[float]] | None = None
    for mask in range(8):  # which of overhead, prefill and context growth join the step term
        cols = [0, 1, 3]
        use = sorted([2] + [cols[i] for i in range(3) if mask >> i & 1])
        coef = _least_squares([[r[j] for j in use] for r in rows], walls)
        if coef is None or any(c < 0 for c in coef) or coef[use.index(2)] <= 0:
            continue
        full = [0.0] * 4
        for j, c in zip(use, coef, strict=True):
            full[j] = c
        residual = sum((w - sum(f * x for f, x in zip(full, r, strict=True))) ** 2 for w, r in zip(walls, rows, strict=True))
        if best is None or residual < best[0] - 1e-15:
            best = (residual, full)
    if best is None:
        return None
    overhead, prefill, step, growth = best[1]
    return RequestCost(overhead, prefill, step, ContextCost(growth, measured_at), len(samples))


def _least_squares(x: Sequence[Sequence[float]], y: Sequence[float]) -> list[float] | None:
    """Ordinary least squares (numpy's); None when the columns are linearly dependent."""
    coef, _, rank, _ = np.linalg.lstsq(np.asarray(x, dtype=float), np.asarray(y, dtype=float), rcond=None)
    return None if rank < len(x[0]) else [float(c) for c in coef]


def draft_step(plain_s: float, ref_s: float, *, k: int, ref_k: int, vocab: int, ref_vocab: int,
               layer_vocab: float) -> float:
    """Step time of an engine drafting ``k`` tokens with a draft head of ``vocab`` rows, from a measured
    engine (``ref_s`` at ``ref_k``, ``ref_vocab``) and the verifier alone (``plain_s``, at the same batch).

    The draft's share of a step, ``ref_s - plain_s``, grows linearly with k (planning.step(k), docs/speed.md) and
    with the draft's weights: one decoder layer, worth ``layer_vocab`` rows of the head, plus ``vocab`` rows. Its
    compute scales so; on a CPU a small pass is partly fixed overhead, so this overstates a larger head's cost."""
    extra = max(0.0, ref_s - plain_s) * (k / ref_k) * ((layer_vocab + vocab) / (layer_vocab + ref_vocab))
    return plain_s + extra
