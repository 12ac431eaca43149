"""Batched generation with transformers: left padding so every prompt ends where generation starts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def generate_greedy(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    temperature: float = 0.0) -> list[list[int]]:
    """New token ids per prompt (greedy unless ``temperature`` > 0); rows end with padding after EOS."""
    import torch

    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(list(p))
        mask[row, width - len(p):] = 1
    device = next(model.parameters()).device
    sample = temperature > 0
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
            do_sample=sample, temperature=temperature if sample else None, top_p=None, top_k=None,
            pad_token_id=pad,
        )
    return [row[width:].tolist() for row in out.cpu()]
