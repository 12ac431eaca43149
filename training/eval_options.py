"""The vocabulary of `polyspec eval`: its options, errors, the draft choice, and how a multi-turn benchmark
becomes conversations. A module of its own so the two scorers (eval_offline, evaluate) and the driver
(eval_api) all build on it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from polyspec.core.errors import InvalidInput, NotFoundError, PolyspecError
from polyspec.models.degenerate import MEASURES
from polyspec.training.benchmarks import BenchPrompt

SUBSETS = ("all", "non_degenerate")
METHODS = ("offline", "vllm")
Conversation = list[dict[str, str]]


class EvalError(PolyspecError):
    """An evaluation that cannot run."""

    exit_code = 2


class EvalOptionError(EvalError, InvalidInput):
    """A bad option value (k < 1, an unknown method, a budget below 1, ...)."""


class UnknownDraft(EvalError, NotFoundError):
    exit_code = NotFoundError.exit_code


class DraftVerifierMismatch(EvalError, InvalidInput):
    """The draft was made for another verifier."""


@dataclass(frozen=True)
class DraftChoice:
    """A draft to evaluate: its display name, directory, the verifier it was made for (when known) and its
    registry reference (when it came from the registry)."""

    name: str
    path: Path
    verifier: str | None = None
    registry_ref: str | None = None


@dataclass
class EvalOptions:
    benchmark: str = "mtbench:en"
    k: int = 3
    turns: str = "all"
    method: str = "offline"
    max_new_tokens: int = 256
    limit: int | None = None
    language: str | None = None
    degenerate_measure: str = "ngram"
    device: str | None = None
    dtype: str | None = None
    batch_size: int = 64
    engine_url: str | None = None  # vllm: a running engine serving the (single) draft
    concurrency: int = 4  # vllm: requests in flight
    progress: bool = True

    def check(self) -> None:
        if self.k < 1:
            raise EvalOptionError(f"--k must be >= 1, got {self.k}")
        if self.max_new_tokens < 1:
            raise EvalOptionError(f"--max-tokens must be >= 1, got {self.max_new_tokens}")
        if self.method not in METHODS:
            raise EvalOptionError(f"--method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if self.degenerate_measure not in MEASURES:
            raise EvalOptionError(f"--degenerate must be one of {', '.join(MEASURES)}, not {self.degenerate_measure!r}")
        if self.batch_size < 1:
            raise EvalOptionError(f"--batch-size must be >= 1, got {self.batch_size}")


def conversations(items: Sequence[BenchPrompt], answer_round: Callable[[list[Conversation]], list[str]],
                  ) -> dict[tuple[str, int], tuple[int, int]]:
    """Ask every item's conversation, turn by turn, the verifier answering earlier turns itself.

    ``answer_round`` gets one round's conversations (all at turn r) and returns the answer texts; the
    result maps (item id, turn) -> (round, index in that round) for the caller's own per-round data.
    """
    by_record: dict[str, tuple[str, ...]] = {}
    for it in items:
        if not it.messages:
            turns = (*it.history, it.text)
            known = by_record.get(it.id, ())
            shorter, longer = sorted((known, turns), key=len)
            if longer[: len(shorter)] != shorter:  # earlier answers are found by id: ids must be unique
                raise EvalOptionError(f"two different prompts share the id {it.id!r}")
            by_record[it.id] = longer
    where: dict[tuple[str, int], tuple[int, int]] = {}
    fixed = [it for it in items if it.messages]
    answers: dict[str, list[str]] = {rid: [] for rid in by_record}
    depth = max((len(t) for t in by_record.values()), default=0)
    for r in range(1, max(depth, 1 if fixed else 0) + 1):
        round_ids = [rid for rid, turns in by_record.items() if len(turns) >= r]
        convs: list[Conversation] = []
        for rid in round_ids:
            turns = by_record[rid]
            conv: Conversation = []
            for t in range(r - 1):
                conv += [{"role": "user", "content": turns[t]}, {"role": "assistant", "content": answers[rid][t]}]
            convs.append([*conv, {"role": "user", "content": turns[r - 1]}])
        extra = fixed if r == 1 else []
        convs += [list(it.messages) for it in extra]
        texts = answer_round(convs)
        for i, rid in enumerate(round_ids):
            answers[rid].append(texts[i])
            where[(rid, r)] = (r, i)
        for j, it in enumerate(extra):
            where[(it.id, it.turn)] = (r, len(round_ids) + j)
    return where
