"""The one shape of speculative-decoding counters: additive, so live rows, engine scrapes, registry rows
and demo tallies add and subtract the same way, and every figure derives from them through
:mod:`polyspec.core.acceptance`.
"""

from __future__ import annotations

import operator
from itertools import accumulate
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from polyspec.core.acceptance import mean_acceptance_length, positions_from_counts


def _pad(values: Sequence[int], width: int) -> tuple[int, ...]:
    return tuple(values) + (0,) * (width - len(values))


def _count(spec: Mapping[str, Any], name: str) -> int | None:
    """A count of an engine's report; None when missing or malformed (not a number, a bool, negative, or
    past 2**53)."""
    value = spec.get(name)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 2**53:
        return None
    return int(value)


@dataclass(frozen=True, slots=True)
class SpecCounts:
    """Counts over some requests. ``accepted_per_pos[i]``: verify steps that accepted position i+1."""

    requests: int = 0
    completion_tokens: int = 0
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    # Wall seconds the engine took for these requests (dispatch to last byte): tokens/s = tokens / seconds.
    generation_s: float = 0.0

    def __add__(self, other: SpecCounts) -> SpecCounts:
        return self._combine(other, 1)

    def __sub__(self, other: SpecCounts) -> SpecCounts:
        return self._combine(other, -1)

    def _combine(self, other: SpecCounts, sign: int) -> SpecCounts:
        mine, theirs = self.accepted_per_pos, other.accepted_per_pos
        if len(mine) != len(theirs):  # rare (a k changed): pad the shorter with zeros
            width = max(len(mine), len(theirs))
            mine, theirs = _pad(mine, width), _pad(theirs, width)
        # The router adds one request's counts to three stores per request: map() over the pairs costs a
        # third of a generator's.
        per_pos = tuple(map(operator.add if sign > 0 else operator.sub, mine, theirs))
        return SpecCounts(
            self.requests + sign * other.requests,
            self.completion_tokens + sign * other.completion_tokens,
            self.num_spec_steps + sign * other.num_spec_steps,
            self.num_draft_tokens + sign * other.num_draft_tokens,
            self.num_accepted_tokens + sign * other.num_accepted_tokens,
            per_pos,
            self.generation_s + sign * other.generation_s,
        )

    @property
    def acceptance(self) -> list[float]:
        """P(>= i drafts accepted) for i = 1..k; all 0.0 (and ``mean_acceptance_length`` None) without steps."""
        return positions_from_counts(self.accepted_per_pos, self.num_spec_steps)

    @property
    def mean_acceptance_length(self) -> float | None:
        return mean_acceptance_length(self.num_accepted_tokens, self.num_spec_steps)

    @property
    def tokens_per_second(self) -> float | None:
        """Observed completion tokens per second of one stream; None before any timed request."""
        return self.completion_tokens / self.generation_s if self.generation_s > 0 else None

    @classmethod
    def from_vllm_metrics(cls, spec: Mapping[str, Any] | None, completion_tokens: int = 0,
                          generation_s: float = 0.0) -> SpecCounts:
        """One request's ``metrics.speculative_decoding`` object (``--per-request-spec-decode-metrics``).

        Missing or malformed fields count as zero: an engine's report must never break accounting.
        """
        spec = spec if isinstance(spec, Mapping) else {}
        hist = spec.get("acceptance_histogram")
        if isinstance(hist, list):
            for h in hist:  # a loop, not all() over a generator: the router reads one report per request
                if not isinstance(h, int) or isinstance(h, bool) or h < 0:
                    hist = []
                    break
        else:
            hist = []
        # accepted_per_pos[i] = sum(hist[i + 1:]): the suffix sums, accumulated from the end.
        per_pos = tuple(accumulate(hist[:0:-1]))[::-1]
        steps = _count(spec, "num_spec_steps")
        accepted = _count(spec, "num_accepted_draft_tokens")
        return cls(
            1,
            max(0, int(completion_tokens)),
            sum(hist) if steps is None else steps,
            _count(spec, "num_draft_tokens") or 0,
            sum(per_pos) if accepted is None else accepted,  # = sum(j * hist[j])
            per_pos,
            max(0.0, float(generation_s)),
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["accepted_per_pos"] = list(self.accepted_per_pos)
        out["acceptance"] = self.acceptance
        out["mean_acceptance_length"] = self.mean_acceptance_length
        out["tokens_per_second"] = self.tokens_per_second
        return out
