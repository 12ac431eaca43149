"""The speed model's arithmetic (core.speed): tokens per step, its uncertainty, step-time curves."""

from __future__ import annotations

import math

import pytest

from polyspec.core.speed import (
    AcceptanceEstimate, blend_acceptance, blend_step, expected_tokens, interpolate, step_variance, tokens_per_second,
)


def test_expected_tokens_is_one_plus_the_rates_up_to_k() -> None:
    rates = [0.8, 0.6, 0.4]
    assert expected_tokens(rates, 3) == pytest.approx(2.8)
    assert expected_tokens(rates, 2) == pytest.approx(2.4)
    assert expected_tokens(rates, 0) == 1.0  # no speculation: the verifier's own token
    assert expected_tokens([], 3) == 1.0  # nothing measured: nothing assumed accepted


def test_positions_beyond_the_measured_ones_extrapolate_with_the_last_conditional_rate() -> None:
    ratio = 0.4 / 0.6
    assert expected_tokens([0.8, 0.6, 0.4], 5) == pytest.approx(2.8 + 0.4 * ratio + 0.4 * ratio**2)
    assert expected_tokens([0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)  # one position: ratio a1 / 1


def test_noisy_rates_are_clamped_to_a_non_increasing_curve_in_zero_one() -> None:
    assert expected_tokens([0.5, 0.7, 1.5, -1], 4) == pytest.approx(1 + 0.5 + 0.5 + 0.5 + 0.0)


def test_step_variance_matches_the_distribution_of_accepted_drafts() -> None:
    assert step_variance([1.0, 1.0, 1.0], 3) == pytest.approx(0.0)  # always 3 accepted
    assert step_variance([0.5, 0.0, 0.0], 3) == pytest.approx(0.25)  # Bernoulli(0.5)
    # X uniform on {0, 1, 2, 3}: P(X >= i) = 3/4, 2/4, 1/4; Var = (16 - 1) / 12
    assert step_variance([0.75, 0.5, 0.25], 3) == pytest.approx(15 / 12)


def test_the_lower_bound_shrinks_towards_the_mean_with_samples_and_never_goes_below_one() -> None:
    rates = (0.75, 0.5, 0.25)
    few, many = AcceptanceEstimate(rates, 4, 0), AcceptanceEstimate(rates, 400, 0)
    assert few.lower(3, 1.64) < many.lower(3, 1.64) < many.mean(3) == pytest.approx(2.5)
    assert many.mean(3) - many.lower(3, 1.64) == pytest.approx(1.64 * math.sqrt(15 / 12 / 400))
    assert AcceptanceEstimate(rates, 1, 0).lower(3, 5.0) == 1.0
    assert AcceptanceEstimate(rates, 0, 0).lower(3, 1.64) == 1.0  # no samples: no claim
    assert many.lower(3, 0.0) == pytest.approx(many.mean(3))


def test_offline_rates_weigh_as_prior_steps_and_live_steps_take_over() -> None:
    est = blend_acceptance([0.6, 0.3, 0.1], 80, 2000, live_per_pos=[200, 100, 0], live_steps=1000, live_requests=10)
    assert est is not None
    assert est.acceptance == pytest.approx(((2000 * 0.6 + 200) / 3000, (2000 * 0.3 + 100) / 3000, 2000 * 0.1 / 3000))
    assert (est.samples, est.steps) == (90, 1000)
    only_live = blend_acceptance(None, 0, 2000, [50, 10], 100, 3)
    assert only_live is not None and only_live.acceptance == (0.5, 0.1) and only_live.samples == 3
    assert blend_acceptance([0.2], 5, 2000).acceptance == (0.2,)  # type: ignore[union-attr]
    assert blend_acceptance(None, 0, 2000) is None


def test_an_evaluation_without_a_prompt_count_still_bounds_above_one() -> None:
    """An offline figure recorded with num_prompts = 0 counts as a few prompts, not as no evidence."""
    from polyspec.core.speed import UNKNOWN_OFFLINE_SAMPLES

    unknown = blend_acceptance([0.7, 0.5, 0.3], 0, 2000)
    assert unknown is not None and unknown.samples == UNKNOWN_OFFLINE_SAMPLES
    assert 1.0 < unknown.lower(3, 1.64) < unknown.mean(3)
    counted = blend_acceptance([0.7, 0.5, 0.3], 400, 2000)
    assert unknown.lower(3, 1.64) < counted.lower(3, 1.64)  # type: ignore[union-attr]


def test_step_times_interpolate_between_batch_sizes_and_extend_the_last_slope() -> None:
    points = {1: 0.050, 4: 0.080}
    assert interpolate(points, 1) == pytest.approx(0.050)
    assert interpolate(points, 2) == pytest.approx(0.060)
    assert interpolate(points, 8) == pytest.approx(0.120)
    assert interpolate(points, 0.5) == pytest.approx(0.050)  # never below the smallest measured batch
    assert interpolate({1: 0.05}, 32) == pytest.approx(0.05)
    assert interpolate({}, 1) is None
    assert interpolate({1: 0.08, 4: 0.05}, 16) == pytest.approx(0.05)  # a falling curve is not extended below its end


def test_calibrated_step_time_is_a_prior_that_live_measurements_replace() -> None:
    assert blend_step(0.05, None, 0, 20) == 0.05
    assert blend_step(None, 0.07, 3, 20) == 0.07
    assert blend_step(0.05, 0.08, 20, 20) == pytest.approx(0.065)
    assert blend_step(None, None, 0, 20) is None
    assert tokens_per_second(2.5, 0.1) == pytest.approx(25.0)
    assert tokens_per_second(2.5, None) is None and tokens_per_second(2.5, 0.0) is None
