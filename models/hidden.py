"""Verifier hidden states in vLLM's Eagle3 conventions (see RUNBOOK "Hidden states: two pitfalls").

- aux layer id L is the hidden state after L decoder layers, residual included: transformers'
  ``output_hidden_states[L]`` (index 0 is the embedding output), which is what vLLM feeds the draft.
- the last state is the PRE-norm output of the final decoder layer: speculators builds its targets
  as ``verifier_lm_head(verifier_norm(last))``. transformers' last ``hidden_states`` entry is
  post-norm, so it is read from the input of ``model.model.norm`` through a forward pre-hook.
"""

from __future__ import annotations

from polyspec.core.errors import InvalidInput
from polyspec.models.batching import length_batches, max_padding_for

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class HiddenStateError(InvalidInput):
    """Bad arguments for hidden-state capture (aux layer out of range, empty sequence, ...)."""


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | None = None) -> torch.dtype:
    """bf16 on GPU; fp32 on CPU, where bf16 matmuls are slow on most cores."""
    import torch

    return torch.bfloat16 if (device or default_device()).startswith("cuda") else torch.float32


def load_verifier_model(
    verifier_path: Any, device: str | None = None, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The verifier as a transformers causal LM (eval mode, sdpa attention) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(getattr(verifier_path, "path", verifier_path)).expanduser()
    device = device or default_device()
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=dtype or default_dtype(device), attn_implementation="sdpa"
    )
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return model.to(device).eval(), tokenizer


def final_norm(model: PreTrainedModel) -> torch.nn.Module:
    """The verifier's final norm: its input is the last pre-norm state, its output feeds the LM head."""
    inner = getattr(model, "model", None)
    norm = getattr(inner, "norm", None)
    if norm is None:
        raise HiddenStateError(f"{type(model).__name__} has no model.norm to hook for the pre-norm state")
    return norm


@contextmanager
def _capture_norm_input(model: PreTrainedModel) -> Iterator[list[torch.Tensor]]:
    seen: list[torch.Tensor] = []

    def hook(_module: Any, args: tuple[Any, ...]) -> None:
        seen.append(args[0])

    handle = final_norm(model).register_forward_pre_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def _check_layers(model: PreTrainedModel, aux_layer_ids: Sequence[int]) -> list[int]:
    n = model.config.num_hidden_layers
    ids = [int(i) for i in aux_layer_ids]
    if not ids or min(ids) < 0 or max(ids) > n:
        raise HiddenStateError(f"aux layer ids must lie in [0, {n}]; got {ids}")
    return ids


def forward_with_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    aux_layer_ids: Sequence[int],
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """One forward pass: (transformers output, aux [B,T,len(ids),H], last pre-norm [B,T,H]).

    Extra kwargs (past_key_values, use_cache, ...) pass through, so decoding loops reuse this.
    """
    import torch

    ids = _check_layers(model, aux_layer_ids)
    with _capture_norm_input(model) as seen:
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, **kwargs)
    aux = torch.stack([out.hidden_states[i] for i in ids], dim=2)
    return out, aux, seen[-1]


def capture_hidden_states(
    model: PreTrainedModel, input_ids: Sequence[int] | torch.Tensor, aux_layer_ids: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states of one token sequence: (aux [T, len(ids), H], last pre-norm [T, H]), on CPU."""
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)
    if ids.shape[1] == 0:
        raise HiddenStateError("cannot capture hidden states of an empty sequence")
    device = next(model.parameters()).device
    with torch.inference_mode():
        _, aux, last = forward_with_hidden(model, ids.to(device), aux_layer_ids, logits_to_keep=1)
    return aux[0].cpu(), last[0].cpu()


def right_padded(sequences: Sequence[Sequence[int]], batch: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequences[i]`` for each i of ``batch`` as rows of (input ids, attention mask), padded on the right to the
    longest: real tokens keep positions 0..T_i-1, so their states equal the unbatched ones."""
    import torch

    width = max(len(sequences[i]) for i in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for row, i in enumerate(batch):
        ids[row, : len(sequences[i])] = torch.as_tensor(sequences[i], dtype=torch.long)
        mask[row, : len(sequences[i])] = 1
    return ids, mask


def capture_hidden_states_batched(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    aux_layer_ids: Sequence[int],
    *,
    max_batch_tokens: int = 8192,
    max_batch_size: int = 64,
    out_dtype: torch.dtype | None = None,
    progress: bool = False,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield (index, aux [T_i, len(ids), H], last [T_i, H]) for every sequence, on CPU.

    Sequences are right-padded inside a batch (positions of real tokens stay 0..T_i-1, so the
    states equal the unbatched ones up to kernel numerics). Results arrive longest-first,
    tagged with their index in ``sequences``.
    """
    import torch
    from tqdm.auto import tqdm

    lengths = [len(s) for s in sequences]
    if any(n == 0 for n in lengths):
        raise HiddenStateError("cannot capture hidden states of an empty sequence")

    device = next(model.parameters()).device
    bar = tqdm(total=len(sequences), desc="hidden states", unit="seq", disable=not progress)
    for batch in length_batches(lengths, max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens,
                                max_padding=max_padding_for(device)):
        ids, mask = right_padded(sequences, batch)
        with torch.inference_mode():
            # the states only: the LM head over the last position alone (a quarter of the pass for SmolLM2-135M)
            _, aux, last = forward_with_hidden(model, ids.to(device), aux_layer_ids, attention_mask=mask.to(device),
                                               logits_to_keep=1)
        aux, last = aux.cpu(), last.cpu()
        if out_dtype is not None:
            aux, last = aux.to(out_dtype), last.to(out_dtype)
        for row, i in enumerate(batch):
            yield i, aux[row, : lengths[i]].clone(), last[row, : lengths[i]].clone()
        bar.update(len(batch))
    bar.close()
