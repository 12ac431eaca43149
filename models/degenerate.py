"""Is a verifier's answer degenerate (a repetition loop)? Two measures over its token ids.

A small verifier answers many non-English prompts with loops under greedy decoding. A draft that
learns the loop is accepted almost every time, so acceptance over such answers says little about what a
user gets. Evaluations therefore report every figure twice: over all answers and over the
non-degenerate ones (docs/evaluation.md).

- ``repeated_ngram_share`` (the default): the share of the answer's tokens that close an n-gram (n = 4)
  already seen earlier in the same answer. It measures what inflates acceptance directly: text that can
  be copied from the answer's own past. It does not depend on length: normal prose of 30 or 300 tokens
  scores near 0, and a loop scores near 1 whatever its period.
- ``distinct_ratio``: distinct tokens / tokens (the first measure, kept for comparison). It falls
  with length even for good prose (function words repeat), so a fixed threshold flags long healthy
  answers and misses short loops.

Pure Python, no torch: the router, the registry and the training data filter may all use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NGRAM = 4
MAX_REPEATED_SHARE = 0.5  # degenerate above: more than half the answer repeats its own 4-grams
MIN_DISTINCT_RATIO = 0.3  # degenerate below: fewer than 3 distinct tokens in 10
MEASURES = ("ngram", "distinct")


def distinct_ratio(tokens: Sequence[int]) -> float:
    """Distinct tokens / tokens; 1.0 for an empty answer (nothing repeats)."""
    return len(set(tokens)) / len(tokens) if tokens else 1.0


def repeated_ngram_share(tokens: Sequence[int], n: int = NGRAM) -> float:
    """Share of tokens that end an n-gram which already ended earlier in ``tokens`` (0.0 when shorter than n)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if len(tokens) < n:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for end in range(n, len(tokens) + 1):
        gram = tuple(tokens[end - n : end])
        if gram in seen:
            repeated += 1
        else:
            seen.add(gram)
    return repeated / len(tokens)


@dataclass(frozen=True)
class AnswerShape:
    """Both measures of one answer and the verdict of the chosen one."""

    tokens: int
    distinct_ratio: float
    repeated_ngram_share: float
    degenerate: bool


def answer_shape(tokens: Sequence[int], measure: str = "ngram") -> AnswerShape:
    """Both measures of ``tokens``; ``degenerate`` follows ``measure`` ("ngram" or "distinct")."""
    if measure not in MEASURES:
        raise ValueError(f"unknown degenerate measure {measure!r}; use one of {', '.join(MEASURES)}")
    ratio, share = distinct_ratio(tokens), repeated_ngram_share(tokens)
    bad = share > MAX_REPEATED_SHARE if measure == "ngram" else ratio < MIN_DISTINCT_RATIO
    return AnswerShape(len(tokens), round(ratio, 4), round(share, 4), bad)


def is_degenerate(tokens: Sequence[int], measure: str = "ngram") -> bool:
    return answer_shape(tokens, measure).degenerate
