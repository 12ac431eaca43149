"""Vocabulary coverage and the merged multi-language vocabulary (models.coverage)."""

from __future__ import annotations

from collections import Counter

import pytest

from polyspec.models.coverage import CoverageError, coverage, merge_vocab, token_counts, tokens_for_target


def test_token_counts_counts_occurrences() -> None:
    assert token_counts([[1, 2, 2], (2, 3), []]) == Counter({2: 3, 1: 1, 3: 1})


def test_coverage_is_a_share_of_occurrences() -> None:
    counts = Counter({1: 6, 2: 3, 3: 1})
    assert coverage(counts, {1}) == pytest.approx(0.6)
    assert coverage(counts, [1, 3, 99]) == pytest.approx(0.7)
    assert coverage(counts, range(10)) == 1.0
    assert coverage(Counter(), {1}) == 0.0


def test_tokens_for_target_takes_the_most_frequent_ids() -> None:
    counts = Counter({1: 6, 2: 3, 3: 1})
    assert tokens_for_target(counts, 0.6) == 1
    assert tokens_for_target(counts, 0.61) == 2
    assert tokens_for_target(counts, 1.0) == 3


def _languages() -> dict[str, Counter[int]]:
    # "big" has a long flat tail; "small" needs its own four ids; both share the id 0.
    big = Counter({0: 50, **{t: 6 for t in range(100, 140)}})
    small = Counter({0: 10, 200: 40, 201: 30, 202: 15, 203: 5})
    return {"big": big, "small": small}


def test_merge_meets_every_target_where_frequency_alone_does_not() -> None:
    counts = _languages()
    plan = merge_vocab(counts, size=32, targets={"big": 0.7, "small": 0.99})
    assert len(plan.ids) == 32 == len(set(plan.ids)) and plan.ids == sorted(plan.ids)
    assert plan.coverage["big"] >= 0.7 and plan.coverage["small"] >= 0.99
    assert {200, 201, 202, 203} <= set(plan.ids)
    assert plan.by_target + plan.by_frequency + plan.by_fallback + plan.required == 32
    # the pooled frequency ranking (big has 5x the tokens) misses small's target at the same size
    pooled = counts["big"] + counts["small"]
    top = {t for t, _ in sorted(pooled.items(), key=lambda kv: (-kv[1], kv[0]))[:32]}
    assert coverage(counts["small"], top) < 0.99
    assert plan.to_json()["languages"]["small"]["target"] == 0.99


def test_merge_keeps_required_ids_and_fills_from_fallback() -> None:
    counts = {"a": Counter({1: 5, 2: 5})}
    plan = merge_vocab(counts, size=6, targets={"a": 0.5}, required=[7], fallback=[1, 8, 9, 10, 11])
    assert plan.ids == [1, 2, 7, 8, 9, 10]
    assert (plan.required, plan.by_target, plan.by_frequency, plan.by_fallback) == (1, 1, 1, 3)


def test_merge_weights_decide_the_fill() -> None:
    counts = {"a": Counter({1: 10, 2: 1}), "b": Counter({3: 10, 4: 1})}
    heavy_b = merge_vocab(counts, size=3, targets={"a": 0.5, "b": 0.5}, weights={"a": 0.1, "b": 0.9})
    heavy_a = merge_vocab(counts, size=3, targets={"a": 0.5, "b": 0.5}, weights={"a": 0.9, "b": 0.1})
    assert heavy_b.ids == [1, 3, 4] and heavy_a.ids == [1, 2, 3]


def test_unreachable_target_names_the_language() -> None:
    with pytest.raises(CoverageError, match=r"small reaches .* of 95\.0%") as exc:
        merge_vocab(_languages(), size=3, targets={"big": 0.5, "small": 0.95})
    assert exc.value.hint and "vocabulary size" in exc.value.hint


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"size": 0}, "must be positive"),
    ({"targets": {"a": 1.5}}, r"in \[0, 1\]"),
    ({"targets": {"zz": 0.5}}, "without tokens: zz"),
    ({"weights": {"a": -1.0}}, "must not be negative"),
    ({"counts": {"a": Counter({1: 1}), "b": Counter()}}, "no tokens to cover for b"),
])
def test_bad_requests_are_refused(kwargs: dict, message: str) -> None:
    args = {"counts": {"a": Counter({1: 1})}, "size": 4, "targets": {"a": 0.5}} | kwargs
    with pytest.raises(CoverageError, match=message):
        merge_vocab(**args)
