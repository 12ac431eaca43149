"""Batches of token sequences grouped by length, for the verifier's generate and forward passes.

On a GPU a batch is cheap to widen, so batches fill up to their size and token budgets. On a CPU a
padded slot costs as much as a real token (and attention grows with the square of the width), so
a batch is also cut before too much of it would be padding: on MT-Bench's 16 first turns (57 to
404 tokens) one batch was 71 % padding, and the offline eval spent 2.5x as long on answers.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

CPU_MAX_PADDING = 0.25  # share of a CPU batch's slots that may be padding


def max_padding_for(device: Any) -> float:
    """The padding share allowed on ``device`` (a torch.device or its name): no cap off the CPU."""
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    return CPU_MAX_PADDING if kind == "cpu" else 1.0


def length_batches(lengths: Sequence[int], *, max_batch_size: int, max_batch_tokens: int = sys.maxsize,
                   max_padding: float = 1.0, longest_first: bool = True) -> Iterator[list[int]]:
    """Indices of ``lengths`` in batches of similar lengths.

    A batch is cut before it would exceed ``max_batch_size`` sequences, ``max_batch_tokens`` padded
    tokens (rows x its longest row) or a ``max_padding`` share of padded slots. A sequence longer than
    the token budget still gets a batch of its own. Longest-first meets an out-of-memory batch early;
    shortest-first keeps a generation run's first results coming quickly.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i] if longest_first else lengths[i])
    batch: list[int] = []
    real = width = 0
    for i in order:
        n = lengths[i]
        wider = max(width, n)
        slots = (len(batch) + 1) * wider
        if batch and (len(batch) >= max_batch_size or slots > max_batch_tokens
                      or 1 - (real + n) / max(slots, 1) > max_padding):
            yield batch
            batch, real, wider = [], 0, n
        batch.append(i)
        real, width = real + n, wider
    if batch:
        yield batch
