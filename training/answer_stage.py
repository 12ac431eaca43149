"""Stage 2's entry point: answers from the transformers path or from a running engine (``--engine URL``).

A module of its own so that the two back ends (``answers`` and ``engine_client``, which builds on it)
need no import of each other.

Under torchrun (training.distributed) rank r answers prompts r::N into ``shards/rank{r}.jsonl`` (each shard
resumes on its own) and rank 0 merges the shards into ``answers.jsonl`` in prompt order.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from polyspec.core.atomic import atomic_path
from polyspec.training.answers import ANSWERS, AnswerWriter, answer_with_transformers
from polyspec.training.config import AnswersConfig
from polyspec.training.engine_client import answer_with_engine
from polyspec.training.errors import TrainingError
from polyspec.training.prompts import read_jsonl
from polyspec.training.runs import console


def build_answers(
    out_dir: Path, prompts_dir: Path, verifier_path: Path, cfg: AnswersConfig, seed: int, device: str
) -> dict[str, Any]:
    """Answer every prompt of prompts/train.jsonl that answers.jsonl does not hold yet."""
    records = read_jsonl(prompts_dir / "train.jsonl")
    writer = AnswerWriter(out_dir / ANSWERS)
    todo = [r for r in records if r["id"] not in writer.done]
    if len(todo) < len(records):
        console.print(f"resuming: {len(records) - len(todo)} answers already on disk, {len(todo)} to go")
    _answer(todo, writer, verifier_path, cfg, seed, device)
    return summarize(out_dir / ANSWERS, engine=cfg.engine_url or "transformers")


def _answer(todo: list[dict[str, Any]], writer: AnswerWriter, verifier_path: Path, cfg: AnswersConfig, seed: int,
            device: str) -> None:
    try:
        if todo and cfg.engine_url:
            answer_with_engine(todo, verifier_path, cfg, writer)
        elif todo:
            answer_with_transformers(todo, verifier_path, cfg, writer, seed, device)
    finally:
        writer.close()


SHARDS = "shards"


def _rows_in(path: Path) -> list[dict[str, Any]]:
    """The complete lines of an answers file, if any: the line a killed worker was writing is skipped."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else ():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _ids_in(path: Path) -> set[str]:
    return {row["id"] for row in _rows_in(path)}


def answer_shard(out_dir: Path, prompts_dir: Path, verifier_path: Path, cfg: AnswersConfig, seed: int, device: str,
                 rank: int, size: int) -> int:
    """Rank ``rank`` of ``size``: answer prompts rank::size; returns the answers its shard holds."""
    mine = read_jsonl(prompts_dir / "train.jsonl")[rank::size]
    shard = out_dir / SHARDS / f"rank{rank}.jsonl"
    shard.parent.mkdir(parents=True, exist_ok=True)
    # Answers of an earlier attempt (one process, or another number of them) are kept, not asked again.
    done = _ids_in(out_dir / ANSWERS).union(*(_ids_in(p) for p in shard.parent.glob("*.jsonl") if p != shard))
    writer = AnswerWriter(shard)
    todo = [r for r in mine if r["id"] not in writer.done | done]
    # Sampled answers (temperature > 0) need a seed per rank, or every rank would draw the same noise.
    _answer(todo, writer, verifier_path, cfg, seed + rank, device)
    return len(_ids_in(shard))


def merge_answer_shards(out_dir: Path, prompts_dir: Path, cfg: AnswersConfig, counts: list[int]) -> dict[str, Any]:
    """Rank 0, after every shard is written: one answers.jsonl in train.jsonl order, each prompt once."""
    order = {r["id"]: n for n, r in enumerate(read_jsonl(prompts_dir / "train.jsonl"))}
    rows: dict[str, dict[str, Any]] = {}
    for path in [out_dir / ANSWERS, *sorted((out_dir / SHARDS).glob("*.jsonl"))]:
        for row in _rows_in(path):
            if row["id"] not in order:
                raise TrainingError(f"{path} answers prompt {row['id']!r}, which prompts/train.jsonl does not hold")
            rows.setdefault(row["id"], row)
    with atomic_path(out_dir / ANSWERS) as tmp:
        tmp.write_text("".join(json.dumps(rows[i], ensure_ascii=False) + "\n" for i in sorted(rows, key=order.get)),
                       encoding="utf-8")
    shutil.rmtree(out_dir / SHARDS)  # merged: the shards would only double the stage's size
    summary = summarize(out_dir / ANSWERS, engine=cfg.engine_url or "transformers")
    return {**summary, "world_size": len(counts), "answers_by_rank": counts}


def summarize(path: Path, engine: str) -> dict[str, Any]:
    rows = read_jsonl(path)
    if not rows:
        raise TrainingError("the verifier produced no answers (all prompts too long?)")
    answer_tokens = sum(r["num_answer_tokens"] for r in rows)
    return {
        "answers": len(rows),
        "answer_tokens": answer_tokens,
        "total_tokens": sum(len(r["input_ids"]) for r in rows),
        "finished": sum(1 for r in rows if r["finished"]),
        "mean_answer_tokens": round(answer_tokens / len(rows), 1),
        "engine": engine,
    }
