"""The acceptance arithmetic of speculative decoding, in one place.

Definitions (vLLM's): a *verify step* proposes k draft tokens; ``histogram[j]`` counts the steps that
accepted exactly j of them (j = 0..k). Per-position acceptance ``a_i`` is P(at least i accepted), i =
1..k, and the mean acceptance length is the tokens one step yields: ``1 + accepted / steps``, which
equals ``1 + sum(a_i)``.

The empty case is defined once: with no verify step nothing was measured, so the rates are all 0.0
and the mean acceptance length is ``None`` (never 1.0, which would claim "measured, nothing accepted").
"""

from __future__ import annotations

from collections.abc import Sequence

MAL_TOLERANCE = 1e-3  # a stored MAL may differ from 1 + sum(rates) by rounding, no more


def positions_from_histogram(histogram: Sequence[int]) -> list[float]:
    """P(>= i drafts accepted) for i = 1..k from ``histogram[j]`` = steps that accepted exactly j."""
    total = sum(histogram)
    if total <= 0:
        return [0.0] * max(0, len(histogram) - 1)
    return [sum(histogram[i:]) / total for i in range(1, len(histogram))]


def positions_from_counts(accepted_per_pos: Sequence[int], steps: int) -> list[float]:
    """Per-position rates from vLLM's counters: ``accepted_per_pos[i]`` steps accepted position i+1."""
    if steps <= 0:
        return [0.0] * len(accepted_per_pos)
    return [n / steps for n in accepted_per_pos]


def mean_acceptance_length(accepted_tokens: int | float, steps: int) -> float | None:
    """1 + accepted draft tokens per verify step; None when no step was taken."""
    if steps <= 0:
        return None
    return 1.0 + accepted_tokens / steps


def mal_from_histogram(histogram: Sequence[int]) -> float | None:
    steps = sum(histogram)
    return mean_acceptance_length(sum(j * n for j, n in enumerate(histogram)), steps)


def mal_from_positions(positions: Sequence[float]) -> float:
    """1 + sum of per-position rates (the same number as the histogram form)."""
    return 1.0 + float(sum(positions))


def merge_histograms(histograms: Sequence[Sequence[int]]) -> list[int]:
    """Element-wise sum; histograms of different k are an error, not something to pad."""
    if not histograms:
        return []
    widths = {len(h) for h in histograms}
    if len(widths) != 1:
        raise ValueError(f"cannot merge acceptance histograms of different k: lengths {sorted(widths)}")
    return [int(sum(col)) for col in zip(*histograms, strict=True)]
