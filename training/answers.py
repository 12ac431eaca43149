"""Stage 2: the verifier answers every training prompt, through its chat template.

Each line of ``answers.jsonl`` holds the token ids the draft trains on (templated prompt + answer) and
the assistant loss mask (1 on answer tokens only, the end-of-turn token included when the verifier
emitted it). Two engines:

- transformers ``generate`` (default): batched, left padding, greedy unless a temperature is set;
- a running vLLM engine (``--engine URL``): see ``training.engine_client``.

The stage resumes: answers are appended batch by batch (flushed and fsynced), a re-run keeps every
complete line and only asks for the prompts still missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.progress import Progress

from polyspec.models.batching import length_batches, max_padding_for
from polyspec.models.degenerate import is_degenerate
from polyspec.models.generation import generate_greedy
from polyspec.models.hidden import load_verifier_model
from polyspec.training.config import AnswersConfig
from polyspec.training.runs import console

ANSWERS = "answers.jsonl"


def template_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the chat-templated conversation, ending with the assistant header."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def eos_ids(tokenizer: Any, generation_config: Any = None) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return ids


def cut_answer(token_ids: Sequence[int], eos: set[int]) -> tuple[list[int], bool]:
    """The answer up to and including the first end-of-turn token; (ids, finished)."""
    out: list[int] = []
    for tok in token_ids:
        out.append(int(tok))
        if tok in eos:
            return out, True
    return out, False


def answer_tokens(row: dict[str, Any], eos: set[int] | None = None) -> list[int]:
    """The answer's token ids of an answers.jsonl row, without its end-of-turn token."""
    ids = row["input_ids"][row["num_prompt_tokens"]:]
    if ids and (ids[-1] in eos if eos is not None else row.get("finished")):
        ids = ids[:-1]
    return ids


def split_degenerate(rows: Iterable[dict[str, Any]], measure: str = "ngram") -> tuple[list[dict], list[dict]]:
    """(kept, dropped): answers that are repetition loops (models.degenerate) go to ``dropped``."""
    kept: list[dict] = []
    dropped: list[dict] = []
    for row in rows:
        (dropped if is_degenerate(answer_tokens(row), measure) else kept).append(row)
    return kept, dropped


def make_row(rec: dict[str, Any], prompt_ids: list[int], answer_ids: list[int], finished: bool, text: str) -> dict:
    return {
        "id": rec["id"],
        "lang": rec.get("lang"),
        "domain": rec.get("domain"),
        "replay": bool(rec.get("replay")),
        "input_ids": prompt_ids + answer_ids,
        "loss_mask": [0] * len(prompt_ids) + [1] * len(answer_ids),
        "num_prompt_tokens": len(prompt_ids),
        "num_answer_tokens": len(answer_ids),
        "finished": finished,
        "answer": text,
    }


class AnswerWriter:
    """Append-only answers.jsonl that survives interruption: complete lines are kept, a torn tail dropped."""

    def __init__(self, path: Path):
        self.path = path
        self.done: set[str] = set()
        if path.exists():
            good = []
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the line being written when the process died
                good.append(line)
                self.done.add(row["id"])
            path.write_text("".join(g + "\n" for g in good), encoding="utf-8")
        self._fh = path.open("a", encoding="utf-8")

    def write(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self._fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            self.done.add(row["id"])
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def _generate_batch(model: Any, tokenizer: Any, prompts: list[list[int]], cfg: AnswersConfig) -> list[list[int]]:
    return generate_greedy(model, tokenizer, prompts, cfg.max_new_tokens, cfg.temperature)


def answer_with_transformers(
    records: list[dict[str, Any]], verifier_path: Path, cfg: AnswersConfig, writer: AnswerWriter, seed: int, device: str
) -> None:
    import torch

    torch.manual_seed(seed)
    model, tokenizer = load_verifier_model(verifier_path, device=device)
    eos = eos_ids(tokenizer, model.generation_config)
    templated = [(rec, template_prompt(tokenizer, rec["messages"])) for rec in records]
    templated = _drop_long(templated, cfg.max_prompt_tokens)
    batches = length_batches([len(p) for _, p in templated], max_batch_size=cfg.batch_size,
                             max_padding=max_padding_for(device), longest_first=False)
    with Progress(console=console, transient=False) as progress:
        task = progress.add_task("verifier answers", total=len(templated))
        for indices in batches:
            batch = [templated[i] for i in indices]
            outputs = _generate_batch(model, tokenizer, [p for _, p in batch], cfg)
            rows = []
            for (rec, prompt_ids), generated in zip(batch, outputs, strict=True):
                answer, finished = cut_answer(generated, eos)
                rows.append(make_row(rec, prompt_ids, answer, finished, tokenizer.decode(answer, skip_special_tokens=True)))
            writer.write(rows)
            progress.advance(task, len(batch))


def _drop_long(templated: list[tuple[dict, list[int]]], limit: int) -> list[tuple[dict, list[int]]]:
    kept = [(r, p) for r, p in templated if len(p) <= limit]
    if len(kept) < len(templated):
        console.print(f"[yellow]skipped {len(templated) - len(kept)} prompts longer than {limit} tokens")
    return kept
