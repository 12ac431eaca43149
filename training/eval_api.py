"""`polyspec eval` as an API: acceptance of drafts on any benchmark file, per draft x language, over all
answers and over non-degenerate answers only (models.degenerate), offline or through live vLLM engines.

- offline: teacher-forced chain acceptance (models.acceptance_tf). The verifier's greedy answers and
  hidden states are computed once, batched over every prompt and turn, then each draft is measured on
  them. Turn t of a multi-turn record is asked after the verifier's own answers to turns 1..t-1.
- vllm: one engine per draft serves the same conversations; its per-request histograms are the figures.

All arithmetic goes through core.acceptance; results leave as JSON (core.atomic) and registry rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from polyspec.core.acceptance import mal_from_histogram, merge_histograms, positions_from_histogram
from polyspec.core.languages import normalize_language
from polyspec.models.acceptance import PromptAcceptance
from polyspec.models.degenerate import MAX_REPEATED_SHARE, MIN_DISTINCT_RATIO, NGRAM, AnswerShape, answer_shape
from polyspec.training.benchmarks import BenchPrompt, load_benchmark, resolve_benchmark
from polyspec.training.eval_offline import score_offline
from polyspec.training.eval_options import (  # noqa: F401 - the API's names, importable from here too
    METHODS, SUBSETS, Conversation, DraftChoice, DraftVerifierMismatch, EvalError, EvalOptionError, EvalOptions,
    UnknownDraft, conversations,
)
from polyspec.training.evaluate import score_vllm

@dataclass
class Answer:
    """One scored answer: the item, its language, the verifier's answer shape and each draft's histogram."""

    item: BenchPrompt
    language: str
    shape: AnswerShape
    per_draft: dict[str, PromptAcceptance] = field(default_factory=dict)


@dataclass
class EvalRow:
    """Figures of one draft on one language over one subset of the answers."""

    draft: str
    language: str
    subset: str
    k: int
    acceptance: list[float]
    mean_acceptance_length: float | None
    histogram: list[int]
    num_prompts: int
    num_tokens: int
    num_spec_steps: int
    num_answers: int  # answers of the language, both subsets: the base of degenerate_share
    degenerate_share: float


@dataclass
class EvalReport:
    benchmark: str
    file: str
    method: str
    verifier: str
    options: dict[str, Any]
    rows: list[EvalRow]
    answers: list[Answer]
    seconds: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark, "file": self.file, "method": self.method, "verifier": self.verifier,
            "options": self.options, "seconds": self.seconds,
            "degenerate": {"measure": self.options["degenerate_measure"], "ngram": NGRAM,
                           "max_repeated_share": MAX_REPEATED_SHARE, "min_distinct_ratio": MIN_DISTINCT_RATIO},
            "records": [asdict(r) for r in self.rows],
            "answers": [{"id": a.item.id, "turn": a.item.turn, "language": a.language, **asdict(a.shape)}
                        for a in self.answers],
        }


def figures(draft: str, language: str, answers: Sequence[Answer], k: int) -> list[EvalRow]:
    """The two rows (all, non_degenerate) of one draft on one language's answers."""
    n_bad = sum(a.shape.degenerate for a in answers)
    share = n_bad / len(answers) if answers else 0.0
    rows = []
    for subset in SUBSETS:
        picked = [a.per_draft[draft] for a in answers if subset == "all" or not a.shape.degenerate]
        hist = merge_histograms([d.histogram for d in picked]) if picked else [0] * (k + 1)
        rows.append(EvalRow(
            draft=draft, language=language, subset=subset, k=k, acceptance=positions_from_histogram(hist),
            mean_acceptance_length=mal_from_histogram(hist), histogram=hist, num_prompts=len(picked),
            num_tokens=sum(len(d.output_ids) for d in picked), num_spec_steps=sum(hist), num_answers=len(answers),
            degenerate_share=share))
    return rows


def languages_of(items: Sequence[BenchPrompt], language: str | None) -> list[str]:
    """One language per item: --language, else the file's ``lang`` field, else fastText on the record's first turn."""
    if language is not None:
        return [normalize_language(language)] * len(items)
    out: list[str] = []
    cache: dict[str, str] = {}
    for it in items:
        if it.language:
            out.append(normalize_language(it.language))
            continue
        if it.id not in cache:
            from polyspec.core.langid import detect

            cache[it.id] = detect((it.history or (it.text,))[0]).language
        out.append(cache[it.id])
    return out


def run_eval(drafts: Sequence[DraftChoice], verifier: Any, options: EvalOptions) -> EvalReport:
    """Evaluate ``drafts`` (already resolved, see eval_drafts.resolve_drafts) with the verifier ``verifier``
    (a models.verifiers.VerifierInfo)."""
    options.check()
    if not drafts:
        raise EvalOptionError("no draft to evaluate")
    names = [d.name for d in drafts]
    if len(set(names)) != len(names):
        raise EvalOptionError(f"a draft is named twice: {names}")
    bench_name, path = resolve_benchmark(options.benchmark)
    items = load_benchmark(path, options.turns, limit=options.limit)
    langs = languages_of(items, options.language)
    started = time.time()
    if options.method == "offline":
        scored, seconds = score_offline(drafts, verifier, items, options)
    else:
        scored, seconds = score_vllm(drafts, verifier, items, options)
    answers = [Answer(it, lang, answer_shape(ids, options.degenerate_measure), per)
               for it, lang, (ids, per) in zip(items, langs, scored, strict=True)]
    rows = [row for d in drafts for lang in sorted(set(langs))
            for row in figures(d.name, lang, [a for a in answers if a.language == lang], options.k)]
    seconds["total"] = round(time.time() - started, 1)
    opts = {key: v for key, v in asdict(options).items() if key not in ("progress",)}
    return EvalReport(bench_name, str(path), options.method, verifier.name, opts, rows, answers, seconds)
