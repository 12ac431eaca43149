"""Stage 2's entry point: answers from the transformers path or from a running engine (``--engine URL``).

A module of its own so that the two back ends (``answers`` and ``engine_client``, which builds on it)
need no import of each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    try:
        if todo and cfg.engine_url:
            answer_with_engine(todo, verifier_path, cfg, writer)
        elif todo:
            answer_with_transformers(todo, verifier_path, cfg, writer, seed, device)
    finally:
        writer.close()
    return summarize(out_dir / ANSWERS, engine=cfg.engine_url or "transformers")


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
