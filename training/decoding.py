"""How the verifier answers training prompts: greedy (the serving decoding) or sampled, several per prompt.

Greedy decoding is what users get in production, so greedy answers are the training data that looks most
like what a draft meets when serving. A small verifier, though, answers many prompts with repetition loops
under greedy decoding, and a draft trained on loops learns loops. Sampling with a repetition
penalty gives several different, loop-free answers per prompt: more data from few prompts, and prefixes that
still come from the verifier's own distribution (the draft's targets are the verifier's logits at every
position whatever the prefix). Both kinds are kept apart in the answers so that their effect can be compared.

Generation is transformers ``generate`` with left padding (as models.generation); ``no_repeat_ngram_size``
is deliberately absent: transformers applies it with a Python loop over every row at every step, far too
slow for batches of a thousand rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from polyspec.core.errors import InvalidInput


class DecodingError(InvalidInput):
    """Decoding settings that cannot be used."""


@dataclass(frozen=True)
class Decoding:
    """One way of answering: ``samples`` answers per prompt; greedy when ``temperature`` is 0."""

    name: str = "greedy"
    temperature: float = 0.0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    samples: int = 1

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.repetition_penalty <= 0 or self.samples < 1:
            raise DecodingError(f"bad decoding settings: {self}")
        if self.temperature == 0 and self.samples > 1:
            raise DecodingError("greedy decoding gives one answer per prompt: set a temperature for samples > 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


GREEDY = Decoding()
# The sampled variant: mild temperature, nucleus sampling and a repetition penalty that breaks
# loops without pushing the verifier far from what it would say.
SAMPLED = Decoding(name="sampled", temperature=0.7, top_p=0.95, repetition_penalty=1.1, samples=2)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, Any]:
    """(ids, attention mask) with every prompt ending in the last column, where generation starts."""
    import torch

    if not prompts or any(len(p) == 0 for p in prompts):
        raise DecodingError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(list(p))
        mask[row, width - len(p):] = 1
    return ids, mask


def generate(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             decoding: Decoding = GREEDY) -> list[list[list[int]]]:
    """New token ids: for each prompt, ``decoding.samples`` rows (padding after the end of turn kept)."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids, mask = left_pad(prompts, pad)
    device = next(model.parameters()).device
    kwargs: dict[str, Any] = {"do_sample": not decoding.greedy, "top_k": None,
                              "repetition_penalty": decoding.repetition_penalty}
    if decoding.greedy:
        kwargs.update(temperature=None, top_p=None)
    else:
        kwargs.update(temperature=decoding.temperature, top_p=decoding.top_p,
                      num_return_sequences=decoding.samples)
    with torch.inference_mode():
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                             pad_token_id=pad, **kwargs)
    rows = [r[ids.shape[1]:].tolist() for r in out.cpu()]
    n = decoding.samples
    return [rows[i * n:(i + 1) * n] for i in range(len(prompts))]
