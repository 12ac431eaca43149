"""Benchmark files for evaluation: any prompt file the one reader (core.prompts) accepts.

A benchmark is named by a path, or by ``mtbench:LANG`` for the MT-Bench translations bundled in
training/data/mtbench (``mtbench`` alone means ``mtbench:en``). Each record becomes one item per
selected turn. Turn t of a multi-turn record (MT-Bench's ``turns``) is asked inside the conversation:
the earlier user turns and the verifier's own answers to them come first, as in MT-Bench itself. A
record given as OpenAI ``messages`` with earlier assistant turns is one item, its conversation as written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from polyspec.core.errors import InvalidInput, NotFoundError
from polyspec.core.prompts import PromptRecord, read_prompt_records

MTBENCH_DIR = Path(__file__).resolve().parent / "data" / "mtbench"
BUNDLED_PREFIX = "mtbench"


class BenchmarkError(InvalidInput):
    """A benchmark that cannot be used: bad name, bad turn selection, nothing left after filtering."""


class BenchmarkNotFound(BenchmarkError, NotFoundError):
    exit_code = NotFoundError.exit_code


UnknownBenchmarkLanguage = BenchmarkNotFound  # the name callers of load_mtbench knew


@dataclass(frozen=True)
class BenchPrompt:
    """One question at one turn. ``history`` holds the record's earlier user turns (answered by the verifier
    at evaluation time); ``messages`` a fixed conversation given by the file, when there is one."""

    id: str
    language: str | None
    category: str
    turn: int
    text: str
    history: tuple[str, ...] = ()
    messages: tuple[dict[str, str], ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        return f"{self.id}-t{self.turn}"


def mtbench_languages() -> list[str]:
    return sorted(p.stem for p in MTBENCH_DIR.glob("*.jsonl"))


def resolve_benchmark(spec: str | Path) -> tuple[str, Path]:
    """(benchmark name, file) for ``mtbench:LANG`` or a path. The name is what the registry records."""
    text = str(spec).strip()
    if not text:
        raise BenchmarkError("empty benchmark name")
    prefix, sep, lang = text.partition(":")
    if prefix == BUNDLED_PREFIX and (sep or not Path(text).exists()):
        lang = lang or "en"
        path = MTBENCH_DIR / f"{lang}.jsonl"
        if not path.is_file():
            raise BenchmarkNotFound(f"no bundled MT-Bench file for {lang!r}; available: "
                                    f"{', '.join(f'mtbench:{x}' for x in mtbench_languages())}")
        return "mtbench", path
    path = Path(text).expanduser()
    if not path.is_file():
        raise BenchmarkNotFound(f"benchmark file not found: {path} (or name a bundled one: mtbench:LANG)")
    return path.stem, path


def parse_turns(turns: str | int | Iterable[int]) -> tuple[int, ...] | None:
    """'1' / '2' / 'all' (None: every turn of each record) -> the selected turns."""
    if isinstance(turns, str):
        if turns.strip().lower() == "all":
            return None
        if not turns.strip().isdigit():
            raise BenchmarkError(f"--turns must be 1, 2 or all, not {turns!r}")
        turns = int(turns)
    selected = (turns,) if isinstance(turns, int) else tuple(int(t) for t in turns)
    if not selected or any(t not in (1, 2) for t in selected):
        raise BenchmarkError(f"--turns must be 1, 2 or all, not {selected}")
    return tuple(sorted(set(selected)))


def _interleave(records: list[PromptRecord]) -> list[PromptRecord]:
    """Round-robin over categories so that a limit keeps the benchmark's mix (MT-Bench files are sorted)."""
    queues: dict[str, list[PromptRecord]] = {}
    for rec in records:
        queues.setdefault(rec.category or rec.domain or "general", []).append(rec)
    out: list[PromptRecord] = []
    pending = list(queues.values())
    while any(pending):
        for q in pending:
            if q:
                out.append(q.pop(0))
    return out


def _items(rec: PromptRecord, turns: tuple[int, ...] | None) -> list[BenchPrompt]:
    category = rec.category or rec.domain or "general"
    if len(rec.messages) > 1:  # a conversation as written: one item, scored as its last turn
        n = len(rec.turns)
        if turns is not None and n not in turns:
            return []
        return [BenchPrompt(rec.id, rec.lang, category, n, rec.turns[-1], messages=rec.messages)]
    wanted = range(1, len(rec.turns) + 1) if turns is None else [t for t in turns if t <= len(rec.turns)]
    return [BenchPrompt(rec.id, rec.lang, category, t, rec.turns[t - 1], history=rec.turns[: t - 1]) for t in wanted]


def load_benchmark(
    spec: str | Path,
    turns: str | int | Iterable[int] = (1,),
    *,
    limit: int | None = None,
    categories: Iterable[str] | None = None,
) -> list[BenchPrompt]:
    """Items of a benchmark file: the first ``limit`` records (categories interleaved), each at the selected turns."""
    if limit is not None and limit < 1:
        raise BenchmarkError(f"--limit must be >= 1, got {limit}")
    _, path = resolve_benchmark(spec)
    selected = parse_turns(turns)
    records = read_prompt_records(path)
    first: dict[str, str] = {}
    for rec in records:  # answers of earlier turns are looked up by id: two records may not share one
        if rec.id in first:
            raise BenchmarkError(f"{rec.where}: id {rec.id!r} is already used at {first[rec.id]}")
        first[rec.id] = rec.where
    wanted = set(categories) if categories is not None else None
    if wanted is not None:
        records = [r for r in records if (r.category or r.domain or "general") in wanted]
    records = _interleave(records)
    items: list[BenchPrompt] = []
    used = 0
    for rec in records:
        if limit is not None and used >= limit:
            break
        got = _items(rec, selected)
        used += bool(got)
        items += got
    if not items:
        what = f"turn {selected[0]}" if selected and len(selected) == 1 else "the selected turns"
        raise BenchmarkError(f"no prompt of {path} has {what}" + (f" in categories {sorted(wanted)}" if wanted else ""))
    return items


def load_mtbench(
    languages: Iterable[str],
    turns: Iterable[int] = (1,),
    categories: Iterable[str] | None = None,
    limit: int | None = None,
) -> dict[str, list[BenchPrompt]]:
    """The bundled MT-Bench files per language (``limit``: first N questions, categories interleaved)."""
    return {lang: [_with_language(p, lang) for p in load_benchmark(f"mtbench:{lang}", tuple(turns), limit=limit,
                                                                    categories=categories)]
            for lang in languages}


def _with_language(item: BenchPrompt, language: str) -> BenchPrompt:
    return item if item.language == language else BenchPrompt(item.id, language, item.category, item.turn, item.text,
                                                               item.history, item.messages)
