"""The canary's tests (polyspec.adapt_stats): a measurably worse candidate is rolled back, a comparable or
better one promoted, too little traffic waits (and rolls back at the deadline)."""

from __future__ import annotations

import math

import pytest

from polyspec.adapt_stats import Arm, acceptance_test, ratio_variance, tps_test, verdict


def arm(name: str, requests: int, tps: float, per_step: float, *, windows: int = 6, speculates: bool = True,
        jitter: float = 0.05) -> Arm:
    """An arm with ``windows`` polls around ``tps`` and a one-position acceptance giving ``per_step`` tokens."""
    tokens = requests * 40
    seconds = tokens / tps
    steps = int(tokens / per_step) if speculates else 0
    polls = [(tokens // windows, seconds / windows * (1 + jitter * (-1) ** i)) for i in range(windows)]
    return Arm(name, requests, tokens, seconds, steps, [int(steps * (per_step - 1))] if speculates else [],
               speculates, polls)


def test_a_slower_candidate_is_rolled_back() -> None:
    v = verdict(arm("candidate", 60, 8.0, 1.3), arm("old", 60, 12.0, 1.6), alpha=0.05, min_requests=30, final=False)
    assert v.decision == "rollback"
    assert {t.metric for t in v.tests if t.worse(0.05)} == {"tokens_per_step", "tokens_per_s"}
    assert "worse at p =" in v.reasons[0]


def test_a_comparable_or_better_candidate_is_promoted() -> None:
    v = verdict(arm("candidate", 60, 12.5, 1.7), arm("old", 60, 12.0, 1.6), alpha=0.05, min_requests=30, final=False)
    assert v.decision == "promote" and all(t.p_worse > 0.5 for t in v.tests)
    same = verdict(arm("candidate", 60, 12.0, 1.6), arm("old", 60, 12.0, 1.6), alpha=0.05, min_requests=30, final=False)
    assert same.decision == "promote"


def test_little_traffic_waits_then_rolls_back_at_the_deadline() -> None:
    cand, old = arm("candidate", 5, 12.0, 1.6), arm("old", 60, 12.0, 1.6)
    assert verdict(cand, old, alpha=0.05, min_requests=30, final=False).decision == "wait"
    final = verdict(cand, old, alpha=0.05, min_requests=30, final=True)
    assert final.decision == "rollback" and "not enough canary traffic" in final.reasons[0]


def test_too_few_polls_fall_back_to_point_estimates_at_the_deadline() -> None:
    cand, old = arm("candidate", 60, 13.0, 1.7, windows=2), arm("old", 60, 12.0, 1.6, windows=2)
    assert verdict(cand, old, alpha=0.05, min_requests=30, final=False).decision == "wait"
    assert verdict(cand, old, alpha=0.05, min_requests=30, final=True).decision == "promote"
    slower = arm("candidate", 60, 11.0, 1.7, windows=2)
    assert verdict(slower, old, alpha=0.05, min_requests=30, final=True).decision == "rollback"


def test_an_old_engine_without_speculation_yields_one_token_per_step() -> None:
    plain = arm("old", 60, 12.0, 1.0, speculates=False)
    assert plain.tokens_per_step == 1.0 and plain.acceptance == []
    assert acceptance_test(arm("candidate", 60, 12.0, 1.5), plain).p_worse > 0.99
    assert acceptance_test(Arm("candidate"), plain).p_worse is None  # nothing measured yet


def test_ratio_variance_needs_polls_and_time() -> None:
    assert ratio_variance([(10, 1.0), (10, 1.0)]) is None
    r, var = ratio_variance([(10, 1.0), (12, 1.0), (8, 1.0)])
    assert r == pytest.approx(10.0) and var == pytest.approx(8 / 6)  # residuals 0, 2, -2: 8 / (3 * 2 * 1^2)
    assert ratio_variance([(10, 0.0), (10, 0.0), (10, 0.0)]) is None
    exact = tps_test(arm("candidate", 60, 12.0, 1.6, jitter=0.0), arm("old", 60, 10.0, 1.6, jitter=0.0))
    assert exact.note.startswith("no variance") and exact.p_worse == 1.0
    assert not math.isnan(exact.candidate)
