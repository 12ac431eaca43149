"""Offline greedy speculative decoding: how many Eagle3 draft tokens the verifier accepts.

The chain follows vLLM's Eagle3 proposer (vllm/v1/spec_decode/llm_base_proposer.py):
- first draft step: for every verified position p not yet seen by the draft, the input is
  ``embed(token[p+1])`` beside ``fc(aux hidden states at p)``; the draft token comes from the last one;
- later steps: ``embed(previous draft token)`` beside the draft's own output state (post-norm when
  the draft has ``norm_output``, pre-norm otherwise), one position further;
- the verifier checks the k drafts greedily; the accepted prefix plus the verifier's own next token
  are kept, and the draft's KV cache is cut back to the verified positions.
Both models keep KV caches (cropped after each verification), so each step costs one verifier pass
of k+1 tokens and k small draft passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from polyspec.core.acceptance import mal_from_histogram, merge_histograms, positions_from_histogram
from polyspec.core.errors import InvalidInput
from polyspec.models.draft_build import load_draft
from polyspec.models.hidden import default_device, forward_with_hidden, load_verifier_model

if TYPE_CHECKING:
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class AcceptanceError(InvalidInput):
    """Bad arguments for an acceptance measurement (k < 1, no prompts, ...)."""


@dataclass
class PromptAcceptance:
    """One prompt's outcome: its histogram and the tokens the verifier produced."""

    histogram: list[int]
    output_ids: list[int]
    # (position of the first draft token, the k drafts, how many were accepted) per spec step
    steps: list[tuple[int, list[int], int]] = field(default_factory=list, repr=False)
    prompt_ids: list[int] = field(default_factory=list, repr=False)


@dataclass
class AcceptanceResult:
    k: int
    acceptance: list[float]
    mean_acceptance_length: float | None  # None: no verify step (core.acceptance's empty case)
    histogram: list[int]
    num_prompts: int
    num_tokens: int
    num_spec_steps: int
    details: list[PromptAcceptance] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def from_histogram(
        cls, histogram: Sequence[int], *, num_prompts: int, num_tokens: int, details: Iterable[PromptAcceptance] = ()
    ) -> AcceptanceResult:
        hist = [int(h) for h in histogram]
        return cls(
            k=len(hist) - 1,
            acceptance=positions_from_histogram(hist),
            mean_acceptance_length=mal_from_histogram(hist),
            histogram=hist,
            num_prompts=num_prompts,
            num_tokens=num_tokens,
            num_spec_steps=sum(hist),
            details=list(details),
        )

    @classmethod
    def of_details(cls, details: Sequence[PromptAcceptance], k: int) -> AcceptanceResult:
        """Pooled over prompts (an empty list gives the empty case: no steps, MAL None)."""
        hist = merge_histograms([d.histogram for d in details]) if details else [0] * (k + 1)
        return cls.from_histogram(hist, num_prompts=len(details), num_tokens=sum(len(d.output_ids) for d in details),
                                  details=details)

    @classmethod
    def merge(cls, results: Sequence[AcceptanceResult]) -> AcceptanceResult:
        if not results or len({r.k for r in results}) != 1:
            raise AcceptanceError("merge needs at least one result and a single k")
        return cls.from_histogram(
            merge_histograms([r.histogram for r in results]),
            num_prompts=sum(r.num_prompts for r in results),
            num_tokens=sum(r.num_tokens for r in results),
            details=[d for r in results for d in r.details],
        )

    def to_dict(self, details: bool = False) -> dict[str, Any]:
        out = asdict(self)
        if not details:
            out.pop("details")
        return out


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str | Sequence[dict[str, str]]) -> list[int]:
    """Token ids of a chat (one user turn, or a list of messages), rendered and tokenized the way vLLM's
    chat endpoint does it."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    found: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            found.update([value] if isinstance(value, int) else value)
    return found


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first ``length`` positions (transformers deprecates crop() with a positive length)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def draft_layers(draft: Eagle3DraftModel, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                 cache: Any = None) -> torch.Tensor:
    """The draft's decoder layers over ``x`` [1, q, 2H] at position ids ``pos`` [1, q]."""
    emb = draft.rotary_emb(x, pos)
    for layer in draft.layers:
        x = layer(x, attention_mask=mask, position_ids=pos, past_key_values=cache,
                  cache_position=pos[0], position_embeddings=emb)
    return x


def fc_aux(draft: Eagle3DraftModel, aux: torch.Tensor) -> torch.Tensor:
    """The draft's projection of verifier aux states [q, n_aux, H] to [q, H]."""
    import torch

    flat = aux.flatten(-2)  # [..., n_aux, H] -> [..., n_aux * H]
    if draft.input_norm is not None:
        flat = draft.input_norm(flat)
    if draft.fc_norm is not None:
        flat = torch.cat([n(c) for n, c in zip(draft.fc_norm, flat.chunk(len(draft.fc_norm), dim=-1), strict=True)], -1)
    return draft.fc(flat)


class _DraftChain:
    """The draft's side of one sequence: its KV cache and the verified states it has not consumed yet."""

    def __init__(self, draft: Eagle3DraftModel, k: int):
        from transformers import DynamicCache

        self.draft, self.k = draft, k
        self.cache = DynamicCache()
        self.consumed = 0  # verified positions whose true entries are in the cache
        self.pending: list[torch.Tensor] = []  # aux states [q, n_aux, H] of positions consumed.. n-1

    def _forward(self, token_ids: torch.Tensor, hidden: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft layers over q new positions from ``start``: (logits of the last, state of the last)."""
        import torch

        d, q = self.draft, token_ids.shape[0]
        x = torch.cat([d.embed_tokens(token_ids), hidden], dim=-1).unsqueeze(0)
        pos = torch.arange(start, start + q, device=x.device).unsqueeze(0)
        mask = None
        if q > 1:  # explicit causal mask: sdpa's is_causal would align it to the wrong corner with a cache
            kv = torch.arange(start + q, device=x.device)
            mask = (kv.unsqueeze(0) <= pos[0].unsqueeze(1))[None, None]
        x = draft_layers(d, x, pos, mask, self.cache)[0, -1:]
        if d.config.norm_output:
            x = d.norm(x)
            return d.lm_head(x)[0], x
        return d.lm_head(d.norm(x))[0], x

    def _to_target(self, logits: torch.Tensor) -> int:
        i = int(logits.argmax())
        return i + int(self.draft.d2t[i]) if self.draft.d2t is not None else i

    def propose(self, tokens: list[int]) -> list[int]:
        """k draft tokens continuing ``tokens`` (whose last token the verifier has not processed yet)."""
        import torch

        n = len(tokens) - 1
        device = self.draft.fc.weight.device
        aux = torch.cat(self.pending, dim=0)
        nxt = torch.tensor(tokens[self.consumed + 1 : n + 1], device=device)
        logits, hidden = self._forward(nxt, fc_aux(self.draft, aux), self.consumed)
        self.consumed, self.pending = n, []
        drafts = [self._to_target(logits)]
        for j in range(1, self.k):
            logits, hidden = self._forward(torch.tensor([drafts[-1]], device=device), hidden, n + j - 1)
            drafts.append(self._to_target(logits))
        crop_cache(self.cache, n)
        return drafts


class OfflineSpeculator:
    """Greedy speculative decoding of one verifier with one Eagle3 draft (both already loaded)."""

    def __init__(self, verifier: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, draft: Eagle3DraftModel, k: int = 3):
        if k < 1:
            raise AcceptanceError(f"k must be >= 1, got {k}")
        self.verifier, self.tokenizer, self.draft, self.k = verifier, tokenizer, draft.eval(), k
        self.aux_ids = list(draft.config.eagle_aux_hidden_state_layer_ids)
        self.eos = eos_token_ids(verifier, tokenizer)
        self.device = next(verifier.parameters()).device

    def _verify(self, ids: list[int], cache: Any) -> tuple[list[int], torch.Tensor]:
        import torch

        x = torch.tensor([ids], device=self.device)
        out, aux, _ = forward_with_hidden(self.verifier, x, self.aux_ids, past_key_values=cache, use_cache=True)
        return out.logits[0].argmax(-1).tolist(), aux[0]

    def run(self, prompt_ids: Sequence[int], max_new_tokens: int) -> PromptAcceptance:
        import torch
        from transformers import DynamicCache

        hist = [0] * (self.k + 1)
        steps: list[tuple[int, list[int], int]] = []
        cache, chain = DynamicCache(), _DraftChain(self.draft, self.k)
        with torch.inference_mode():
            greedy, aux = self._verify(list(prompt_ids), cache)
            tokens, out = [*prompt_ids, greedy[-1]], [greedy[-1]]
            chain.pending.append(aux)
            while len(out) < max_new_tokens and out[-1] not in self.eos:
                drafts = chain.propose(tokens)
                n = len(tokens) - 1
                greedy, aux = self._verify([tokens[-1], *drafts], cache)
                a = 0
                while a < self.k and drafts[a] == greedy[a]:
                    a += 1
                hist[a] += 1
                steps.append((n + 1, drafts, a))
                new = [*drafts[:a], greedy[a]]
                crop_cache(cache, n + a + 1)
                chain.pending.append(aux[: a + 1])
                tokens += new
                out += new
                stop = next((i for i, t in enumerate(out) if t in self.eos), None)
                if stop is not None:
                    out = out[: stop + 1]
                    break
        return PromptAcceptance(histogram=hist, output_ids=out[:max_new_tokens], steps=steps, prompt_ids=list(prompt_ids))


def measure_acceptance_models(
    verifier: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    draft: Eagle3DraftModel,
    prompts: Sequence[str],
    *,
    k: int = 3,
    max_new_tokens: int = 128,
    progress: bool = True,
    desc: str = "acceptance",
) -> AcceptanceResult:
    """Acceptance of already-loaded models over chat prompts (draft and verifier on the same device)."""
    from tqdm.auto import tqdm

    if not prompts:
        raise AcceptanceError("no prompts to measure acceptance on")
    spec = OfflineSpeculator(verifier, tokenizer, draft, k=k)
    details: list[PromptAcceptance] = []
    bar = tqdm(prompts, desc=desc, unit="prompt", disable=not progress)
    for prompt in bar:
        details.append(spec.run(chat_prompt_ids(tokenizer, prompt), max_new_tokens))
        mal = mal_from_histogram(merge_histograms([d.histogram for d in details]))
        if mal is not None:
            bar.set_postfix(mal=f"{mal:.2f}")
    return AcceptanceResult.of_details(details, k)


def measure_acceptance(
    draft_path: Any,
    verifier_path: Any,
    prompts: Sequence[str],
    *,
    k: int = 3,
    max_new_tokens: int = 128,
    device: str | None = None,
    dtype: torch.dtype | str | None = None,
    progress: bool = True,
) -> AcceptanceResult:
    """Load verifier and draft (cuda when available, else cpu) and measure acceptance on ``prompts``."""
    import torch

    device = device or default_device()
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    verifier, tokenizer = load_verifier_model(verifier_path, device=device, dtype=dtype)
    draft = load_draft(draft_path, verifier_path, device=device, dtype=next(verifier.parameters()).dtype)
    return measure_acceptance_models(
        verifier, tokenizer, draft, prompts, k=k, max_new_tokens=max_new_tokens, progress=progress
    )
