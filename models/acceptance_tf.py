"""Teacher-forced chain acceptance: the same histogram as step-by-step greedy speculative decoding,
computed in a few batched passes, so one GPU measures many drafts on many languages in seconds.

Greedy speculative decoding emits exactly the verifier's greedy answer. So the answer (its
*trajectory*) and the verifier's aux hidden states along it can be computed once per prompt and
shared by every draft. For one draft, three causal passes then give every position's chain at once:

- step 1 at position i: ``embed(x[i+1])`` beside ``fc(aux[i])``, causal over the step-1 entries
  (vLLM's draft cache holds exactly those for the verified positions), predicting ``x[i+2]``;
- step s > 1 at position i: ``embed(x[i+s])`` beside the draft's own step s-1 state at i, at
  position id ``i+s-1``, attending to step-1 entries ``<= i`` and to its own chain's later entries;
  teacher forcing the token is exact, since a chain only goes on when its drafts equal the answer.

``a[i]`` is the number of leading matches of chain i. Decoding is then replayed: it starts at the
first answer token and jumps ``a + 1`` tokens per verification, as models.acceptance.OfflineSpeculator
does, so the histogram counts the same steps (tests/models/test_acceptance_tf.py checks this).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from polyspec.models.acceptance import (
    AcceptanceError,
    AcceptanceResult,
    PromptAcceptance,
    chat_prompt_ids,
    draft_layers,
    eos_token_ids,
    fc_aux,
)
from polyspec.models.batching import length_batches, max_padding_for
from polyspec.models.generation import generate_greedy
from polyspec.models.hidden import final_norm, forward_with_hidden, right_padded

if TYPE_CHECKING:
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class Trajectory:
    """One prompt's greedy answer and the verifier's aux states along it (on the verifier's device)."""

    token_ids: list[int]  # templated prompt + answer (+ k look-ahead tokens past the budget)
    prompt_len: int
    aux: torch.Tensor  # [len(token_ids), n_aux, H]
    eos_at: int | None  # index of the first end-of-turn token in the answer, if any
    mismatches: int = 0  # answer tokens that differ from the teacher-forced argmax (numerics)


def _ttt_mask(m: int, steps: int, device: Any) -> torch.Tensor:
    """[1, 1, steps*m, steps*m] boolean: step 1 causal; a later step's row i sees step-1 keys <= i and
    its own chain's entries (same i) of steps up to its own."""
    import torch

    idx = torch.arange(m, device=device)
    causal = idx.unsqueeze(0) <= idx.unsqueeze(1)
    diag = torch.eye(m, dtype=torch.bool, device=device)
    none = torch.zeros_like(diag)
    blocks = [torch.cat([causal, *[diag if 1 <= t <= s else none for t in range(1, steps)]], dim=1)
              for s in range(steps)]
    return torch.cat(blocks, dim=0)[None, None]


def chain_lengths(draft: Eagle3DraftModel, trajs: Sequence[Trajectory], k: int) -> list[list[int]]:
    """a[i] for every chain start i of each trajectory: how many of its k drafts equal the next tokens.

    Trajectories are right-padded into one batch: padding sits after every real position, and the
    mask only looks back (or at the chain itself), so it never changes a real chain.
    """
    import torch

    device = trajs[0].aux.device
    lens = [len(t.token_ids) for t in trajs]
    n = max(lens)
    m = n - 1  # chain starts i = 0 .. n-2 (step 1 needs x[i+1])
    if m <= 0:
        return [[] for _ in trajs]
    x = torch.zeros(len(trajs), n, dtype=torch.long, device=device)
    aux = torch.zeros(len(trajs), n, *trajs[0].aux.shape[1:], dtype=draft.fc.weight.dtype, device=device)
    limit = torch.empty(len(trajs), 1, dtype=torch.long, device=device)
    for row, t in enumerate(trajs):
        x[row, : lens[row]] = torch.tensor(t.token_ids, device=device)
        aux[row, : lens[row]] = t.aux
        limit[row] = t.eos_at + 1 if t.eos_at is not None else lens[row]  # nothing is known after end of turn
    starts = torch.arange(m, device=device)
    with torch.inference_mode():
        inputs = [torch.cat([draft.embed_tokens(x[:, 1:]), fc_aux(draft, aux[:, :m])], dim=-1)]
        positions = [starts]
        matches = torch.ones(len(trajs), m, dtype=torch.bool, device=device)
        lengths = torch.zeros(len(trajs), m, dtype=torch.long, device=device)
        for s in range(1, k + 1):
            seq, pos = torch.cat(inputs, dim=1), torch.cat(positions).unsqueeze(0)
            out = draft_layers(draft, seq, pos, _ttt_mask(m, s, device))[:, (s - 1) * m :]
            state = draft.norm(out) if draft.config.norm_output else out
            pred = draft.lm_head(state if draft.config.norm_output else draft.norm(out)).argmax(-1)
            if draft.d2t is not None:
                pred = pred + draft.d2t[pred]
            target_idx = starts + s + 1  # step s of chain i predicts x[i+s+1]
            target = x[:, target_idx.clamp(max=n - 1)]
            matches &= (target_idx.unsqueeze(0) < limit) & (pred == target)
            lengths += matches.long()
            if s < k:
                inputs.append(torch.cat([draft.embed_tokens(x[:, (starts + s + 1).clamp(max=n - 1)]), state], dim=-1))
                positions.append(starts + s)
    return [row[: max(0, ln - 1)] for row, ln in zip(lengths.tolist(), lens, strict=True)]


def replay(traj: Trajectory, lengths: Sequence[int], k: int, max_new_tokens: int) -> PromptAcceptance:
    """Walk the trajectory the way greedy speculative decoding does and count each step's accepted drafts."""
    hist = [0] * (k + 1)
    steps: list[tuple[int, list[int], int]] = []
    p = traj.prompt_len
    last = min(len(traj.token_ids), p + max_new_tokens + k) - 1
    out = 1  # the verifier's pass over the prompt gives the first answer token
    while out < max_new_tokens and (traj.eos_at is None or p + out - 1 < traj.eos_at):
        i = p + out - 2  # chain start: the position before the last verified token
        if i + 1 + k > last and (traj.eos_at is None or traj.eos_at > last):
            raise AcceptanceError("trajectory too short for the token budget: generate max_new_tokens + k tokens")
        a = int(lengths[i])
        hist[a] += 1
        steps.append((i + 2, [], a))
        out += a + 1
    n_out = min(out, max_new_tokens)
    if traj.eos_at is not None:
        n_out = min(n_out, traj.eos_at - p + 1)
    return PromptAcceptance(histogram=hist, output_ids=traj.token_ids[p : p + n_out], steps=steps,
                            prompt_ids=traj.token_ids[:p])


class TeacherForcedAcceptance:
    """Verifier trajectories computed once, then any number of drafts measured on them."""

    def __init__(self, verifier: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 aux_layer_ids: Sequence[int], *, k: int = 3, max_new_tokens: int = 256):
        if k < 1:
            raise AcceptanceError(f"k must be >= 1, got {k}")
        self.verifier, self.tokenizer, self.k = verifier, tokenizer, k
        self.aux_layer_ids, self.max_new_tokens = list(aux_layer_ids), max_new_tokens
        self.eos = eos_token_ids(verifier, tokenizer)
        self.groups: dict[str, list[Trajectory]] = {}

    def add(self, group: str, prompts: Sequence[str], *, batch_size: int = 256, max_batch_tokens: int = 65536,
            progress: bool = True) -> list[Trajectory]:
        """Greedy answers (batched generate) and aux states for ``prompts``, stored under ``group``."""
        return self.add_groups({group: prompts}, batch_size=batch_size, max_batch_tokens=max_batch_tokens,
                               progress=progress)[group]

    def add_groups(self, groups: dict[str, Sequence[str | Sequence[dict[str, str]]]], *, batch_size: int = 256, max_batch_tokens: int = 65536,
                   progress: bool = True) -> dict[str, list[Trajectory]]:
        """Several groups in one generation pass: the prompts of all groups are batched together by length,
        which keeps a GPU busy where one small group per call would leave it idle. A prompt is a user turn
        or a whole conversation (OpenAI messages ending with a user turn, e.g. MT-Bench's second turn)."""
        empty = [g for g, prompts in groups.items() if not prompts]
        if empty or not groups:
            raise AcceptanceError(f"no prompts for group {empty[0] if empty else '(none)'!r}")
        keys = [(g, j) for g, prompts in groups.items() for j in range(len(prompts))]
        ids = [chat_prompt_ids(self.tokenizer, groups[g][j]) for g, j in keys]
        answers = self._generate(ids, batch_size, progress, ",".join(groups)[:40])
        trajs = self._trajectories(ids, answers, max_batch_tokens)
        out: dict[str, list[Trajectory]] = {g: [] for g in groups}
        for (g, _), t in zip(keys, trajs, strict=True):
            out[g].append(t)
        for g, ts in out.items():
            self.groups.setdefault(g, []).extend(ts)
        return out

    def _generate(self, prompts: list[list[int]], batch_size: int, progress: bool, desc: str) -> list[list[int]]:
        from tqdm.auto import tqdm

        device = next(self.verifier.parameters()).device
        out: list[list[int]] = [[] for _ in prompts]
        batches = list(length_batches([len(p) for p in prompts], max_batch_size=batch_size,
                                      max_padding=max_padding_for(device), longest_first=False))
        for chunk in tqdm(batches, desc=f"answers {desc}", disable=not progress):
            for i, gen in zip(chunk, generate_greedy(self.verifier, self.tokenizer, [prompts[i] for i in chunk],
                                                     self.max_new_tokens + self.k), strict=True):
                out[i] = gen
        return out

    def _trajectories(self, prompts: list[list[int]], answers: list[list[int]], max_batch_tokens: int) -> list[Trajectory]:
        import torch

        seqs = [p + self._cut(a) for p, a in zip(prompts, answers, strict=True)]
        trajs: list[Trajectory | None] = [None] * len(seqs)
        device = next(self.verifier.parameters()).device
        head, norm = self.verifier.get_output_embeddings(), final_norm(self.verifier)
        for batch in length_batches([len(s) for s in seqs], max_batch_size=256, max_batch_tokens=max_batch_tokens,
                                    max_padding=max_padding_for(device)):
            ids, mask = right_padded(seqs, batch)
            with torch.inference_mode():
                # logits only where an answer token is checked: the full-vocabulary logits of every
                # prompt position would cost a fifth of the pass and ~200 KB per token
                _, aux, last = forward_with_hidden(self.verifier, ids.to(device), self.aux_layer_ids,
                                                   attention_mask=mask.to(device), logits_to_keep=1)
                for row, i in enumerate(batch):
                    p, n = len(prompts[i]), len(seqs[i])
                    greedy = head(norm(last[row, p - 1 : n - 1])).argmax(-1).cpu()
                    eos = next((j for j in range(p, n) if seqs[i][j] in self.eos), None)
                    mism = int((greedy != ids[row, p:n]).sum())
                    trajs[i] = Trajectory(seqs[i], p, aux[row, :n].clone(), eos, mism)
        return [t for t in trajs if t is not None]

    def answer_ids(self, traj: Trajectory, max_new_tokens: int | None = None) -> list[int]:
        """The answer a user would have received (at most ``max_new_tokens``, end-of-turn token excluded)."""
        budget = max_new_tokens or self.max_new_tokens
        end = traj.eos_at if traj.eos_at is not None else len(traj.token_ids)
        return traj.token_ids[traj.prompt_len : min(end, traj.prompt_len + budget)]

    def _cut(self, answer: list[int]) -> list[int]:
        for j, tok in enumerate(answer):
            if tok in self.eos:
                return answer[: j + 1]
        return answer

    def measure(self, draft: Eagle3DraftModel, group: str, *, max_new_tokens: int | None = None,
                batch_size: int = 32) -> AcceptanceResult:
        """Acceptance of ``draft`` on a stored group (max_new_tokens at most the one generated with)."""
        budget = max_new_tokens or self.max_new_tokens
        if budget > self.max_new_tokens:
            raise AcceptanceError(f"trajectories hold {self.max_new_tokens} tokens; asked for {budget}")
        if group not in self.groups:
            raise AcceptanceError(f"unknown group {group!r}; have {', '.join(self.groups) or 'none'}")
        if list(draft.config.eagle_aux_hidden_state_layer_ids) != self.aux_layer_ids:
            raise AcceptanceError(f"draft reads aux layers {draft.config.eagle_aux_hidden_state_layer_ids}, "
                                  f"trajectories hold {self.aux_layer_ids}")
        trajs = self.groups[group]
        details: list[PromptAcceptance | None] = [None] * len(trajs)
        for batch in length_batches([len(t.token_ids) for t in trajs], max_batch_size=batch_size,
                                    max_padding=max_padding_for(trajs[0].aux.device)):
            chunk = [trajs[i] for i in batch]
            for i, t, a in zip(batch, chunk, chain_lengths(draft, chunk, self.k), strict=True):
                details[i] = replay(t, a, self.k, budget)
        return AcceptanceResult.of_details([d for d in details if d is not None], self.k)
