"""core.speed.fit_request_cost: one engine's request time at batch 1 by least squares over calibration's requests
(overhead per request, prefill per prompt token, decode step and its growth with context), every term non-negative."""

from __future__ import annotations

import pytest

from polyspec.core.speed import MIN_FIT_REQUESTS, fit_request_cost

OVERHEAD, PREFILL, STEP, GROWTH, AT = 0.3, 0.0025, 0.07, 0.00004, 48.0


def _wall(steps: int, tokens: int, prompt: int, stall: float = 0.0) -> float:
    return OVERHEAD + stall + prompt * PREFILL + steps * (STEP + GROWTH * (prompt + tokens / 2 - AT))


def _calibration(stall_every: int = 0) -> list[tuple[float, int, int, int]]:
    """Step waves (short prompt, 64 tokens), one-token pairs and full-length pairs, as router.calibrate sends them:
    (wall, steps, completion tokens, prompt tokens)."""
    shapes = [(32, 64, 16)] * 6 + [(0, 1, 20), (0, 1, 380), (32, 64, 20), (33, 64, 380)] * 6
    out = []
    for n, (steps, tokens, prompt) in enumerate(shapes):
        stall = 0.9 if stall_every and n % stall_every == 0 else 0.0
        out.append((_wall(steps, tokens, prompt, stall), steps, tokens, prompt))
    return out


def test_the_fit_recovers_each_term_of_a_linear_engine() -> None:
    fit = fit_request_cost(_calibration(), AT)
    assert fit is not None and fit.requests == 30
    assert fit.overhead_s == pytest.approx(OVERHEAD) and fit.prefill_s_per_token == pytest.approx(PREFILL)
    assert fit.step_s == pytest.approx(STEP) and fit.context.s_per_token == pytest.approx(GROWTH)
    assert fit.context.measured_at == AT
    # a chat request of 110 prompt tokens and 96 answer tokens in 33 steps, as the engine would take it
    assert fit.seconds(33, 110, 96) == pytest.approx(_wall(33, 96, 110))


def test_stalls_count_in_the_mean_as_overhead_not_in_the_step() -> None:
    samples = _calibration(stall_every=3)
    fit = fit_request_cost(samples, AT)
    assert fit is not None
    stalls = sum(1 for n in range(len(samples)) if n % 3 == 0)
    # what a client's tokens/s sees over many requests: the mean stall per request, beside the step
    assert fit.overhead_s == pytest.approx(OVERHEAD + 0.9 * stalls / len(samples), abs=0.03)
    assert fit.step_s == pytest.approx(STEP, rel=0.02)
    mean_wall = sum(w for w, *_ in samples) / len(samples)
    assert sum(fit.seconds(s, p, t) for _, s, t, p in samples) / len(samples) == pytest.approx(mean_wall)


def test_every_term_stays_non_negative() -> None:
    # a long prompt that came out faster than the short one (noise): no negative prefill or growth, and the
    # remaining terms still describe the requests
    samples = [(w if p < 100 else w - 0.6, s, t, p) for w, s, t, p in _calibration()]
    fit = fit_request_cost(samples, AT)
    assert fit is not None
    assert min(fit.overhead_s, fit.prefill_s_per_token, fit.context.s_per_token) >= 0 and fit.step_s > 0


def test_too_few_or_too_alike_requests_give_no_fit() -> None:
    assert fit_request_cost(_calibration()[: MIN_FIT_REQUESTS - 1], AT) is None
    same = [(1.0, 0, 1, 16)] * 12  # nothing but one-token answers: no step to fit
    assert fit_request_cost(same, AT) is None
