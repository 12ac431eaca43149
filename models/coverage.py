"""Vocabulary coverage: how much of a language's verifier tokens a draft vocabulary holds, and a merged
vocabulary for several languages that meets a coverage target for each of them.

Coverage of a language is the share of its token *occurrences* (not distinct ids) whose ids are in the draft
vocabulary: a draft can only propose tokens of its vocabulary, so an answer token outside it is a token the
draft can never get right.

    counts = token_counts(answer_id_lists)              # Counter {token id: occurrences}
    coverage(counts, draft_ids)                         # 0.0 .. 1.0
    plan = merge_vocab({"en": en, "fr": fr}, size=16384, targets={"en": 0.97, "fr": 0.95},
                       weights={"en": 0.5, "fr": 0.5})
    plan.ids, plan.coverage                            # sorted ids; {"en": 0.97.., "fr": 0.95..}

``merge_vocab`` picks tokens greedily by their marginal gain towards every language's target (a language that
has reached its target stops pulling), so a language with a large alphabet cannot crowd out the others and
round robin's waste on a language already covered is avoided; the slots left are filled by the mixture's
weighted frequency, then by ``fallback`` ids. The capped gain is submodular, so a lazy heap gives the same
choice as a full re-scan at every step.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from polyspec.core.errors import InvalidInput

_EPS = 1e-12


class CoverageError(InvalidInput):
    """A coverage request that cannot be met or makes no sense (no tokens, a target out of range)."""


def token_counts(token_id_lists: Iterable[Iterable[int]]) -> Counter[int]:
    """Occurrences of every token id over ``token_id_lists`` (e.g. the verifier's answers of one language)."""
    counts: Counter[int] = Counter()
    for ids in token_id_lists:
        counts.update(int(t) for t in ids)
    return counts


def coverage(counts: Mapping[int, int], vocab_ids: Collection[int]) -> float:
    """Share of the occurrences in ``counts`` whose id is in ``vocab_ids``; 0.0 when ``counts`` is empty."""
    total = sum(counts.values())
    if not total:
        return 0.0
    ids = vocab_ids if isinstance(vocab_ids, (set, frozenset)) else set(vocab_ids)
    return sum(c for t, c in counts.items() if t in ids) / total


def tokens_for_target(counts: Mapping[int, int], target: float) -> int:
    """The fewest ids that reach ``target`` coverage of ``counts`` on their own (its most frequent ids)."""
    total = sum(counts.values())
    if not total:
        return 0
    reached = 0
    for n, c in enumerate(sorted(counts.values(), reverse=True), start=1):
        reached += c
        if reached / total >= target - _EPS:
            return n
    return len(counts)


@dataclass(frozen=True)
class VocabPlan:
    """A merged vocabulary: sorted ``ids``, the coverage each language gets, and how the slots were spent."""

    ids: list[int]
    coverage: dict[str, float]
    targets: dict[str, float]
    required: int = 0  # ids given up front (e.g. a parent draft's vocabulary)
    by_target: int = 0  # ids picked greedily to reach the targets
    by_frequency: int = 0  # ids filled in by weighted frequency
    by_fallback: int = 0  # ids filled in from the fallback list
    needed_alone: dict[str, int] = field(default_factory=dict)  # ids each language needs on its own

    def to_json(self) -> dict[str, object]:
        return {"size": len(self.ids), "required": self.required, "by_target": self.by_target,
                "by_frequency": self.by_frequency, "by_fallback": self.by_fallback,
                "languages": {lang: {"coverage": round(self.coverage[lang], 4), "target": self.targets.get(lang),
                                     "needed_alone": self.needed_alone.get(lang)} for lang in sorted(self.coverage)}}


def merge_vocab(counts: Mapping[str, Mapping[int, int]], size: int, targets: Mapping[str, float],
                weights: Mapping[str, float] | None = None, required: Iterable[int] = (),
                fallback: Iterable[int] = ()) -> VocabPlan:
    """``size`` ids that give every language of ``counts`` at least ``targets[lang]`` coverage.

    ``required`` ids are always in (a parent draft's vocabulary, the end-of-turn token). Raises CoverageError,
    naming the languages, when a target cannot be reached within ``size`` ids.
    """
    _check(counts, size, targets)
    totals = {lang: sum(c.values()) for lang, c in counts.items()}
    weights = _normalised(weights or {lang: 1.0 for lang in counts}, counts)
    chosen: set[int] = set()
    for t in required:
        chosen.add(int(t))
    if len(chosen) > size:
        raise CoverageError(f"{len(chosen)} required ids do not fit a vocabulary of {size}")
    reached = {lang: sum(c for t, c in counts[lang].items() if t in chosen) / totals[lang] for lang in counts}
    needed_alone = {lang: tokens_for_target(counts[lang], targets.get(lang, 0.0)) for lang in counts}
    n_required = len(chosen)
    by_target = _greedy(counts, totals, targets, reached, chosen, size)
    short = {lang: reached[lang] for lang in counts if reached[lang] < targets.get(lang, 0.0) - _EPS}
    if short:
        detail = ", ".join(f"{lang} reaches {cov:.1%} of {targets[lang]:.1%} (needs {needed_alone[lang]} ids alone)"
                           for lang, cov in sorted(short.items()))
        raise CoverageError(f"coverage target cannot be met with a {size}-token vocabulary: {detail}",
                            hint="lower the coverage target or raise the draft vocabulary size")
    score: Counter[float] = Counter()
    for lang, c in counts.items():
        for t, n in c.items():
            score[t] += weights[lang] * n / totals[lang]
    by_frequency = 0
    for t, _ in sorted(score.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(chosen) >= size:
            break
        if t not in chosen:
            chosen.add(t)
            by_frequency += 1
    by_fallback = 0
    for t in fallback:
        if len(chosen) >= size:
            break
        if int(t) not in chosen:
            chosen.add(int(t))
            by_fallback += 1
    final = {lang: coverage(counts[lang], chosen) for lang in counts}
    return VocabPlan(sorted(chosen), final, dict(targets), n_required, by_target, by_frequency, by_fallback,
                     needed_alone)


def _check(counts: Mapping[str, Mapping[int, int]], size: int, targets: Mapping[str, float]) -> None:
    if size < 1:
        raise CoverageError(f"vocabulary size must be positive, got {size}")
    empty = sorted(lang for lang, c in counts.items() if not sum(c.values()))
    if empty:
        raise CoverageError(f"no tokens to cover for {', '.join(empty)}")
    bad = {lang: t for lang, t in targets.items() if not 0.0 <= t <= 1.0}
    if bad:
        raise CoverageError(f"coverage targets must lie in [0, 1]: {bad}")
    unknown = sorted(set(targets) - set(counts))
    if unknown:
        raise CoverageError(f"coverage targets for languages without tokens: {', '.join(unknown)}")


def _normalised(weights: Mapping[str, float], counts: Mapping[str, object]) -> dict[str, float]:
    if any(w < 0 for w in weights.values()):
        raise CoverageError(f"mixture weights must not be negative: {dict(weights)}")
    total = sum(weights.get(lang, 0.0) for lang in counts)
    if total <= 0:
        raise CoverageError(f"mixture weights give no language any weight: {dict(weights)}")
    return {lang: weights.get(lang, 0.0) / total for lang in counts}


def _greedy(counts: Mapping[str, Mapping[int, int]], totals: dict[str, int], targets: Mapping[str, float],
            reached: dict[str, float], chosen: set[int], size: int) -> int:
    """Add ids by their capped gain sum_l min(share_l(t), gap_l) until every gap closes or ``size`` is reached.
    Lazy: a popped id whose recomputed gain still tops the heap is the true best (gains only shrink)."""
    langs_of: dict[int, list[tuple[str, float]]] = {}
    for lang, c in counts.items():
        if targets.get(lang, 0.0) <= 0:
            continue
        for t, n in c.items():
            if t not in chosen:
                langs_of.setdefault(t, []).append((lang, n / totals[lang]))

    def gain(t: int) -> float:
        return sum(min(share, max(0.0, targets[lang] - reached[lang])) for lang, share in langs_of[t])

    heap = [(-gain(t), t) for t in langs_of]
    heapq.heapify(heap)
    added = 0
    while heap and len(chosen) < size and any(reached[lang] < targets.get(lang, 0.0) - _EPS for lang in reached):
        _, t = heapq.heappop(heap)
        g = gain(t)
        if g <= _EPS:
            continue
        if heap and g < -heap[0][0] - _EPS:
            heapq.heappush(heap, (-g, t))
            continue
        chosen.add(t)
        added += 1
        for lang, share in langs_of[t]:
            reached[lang] += share
    return added
