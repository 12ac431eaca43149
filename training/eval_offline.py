"""The offline method of `polyspec eval`: teacher-forced chain acceptance, batched, GPU or CPU.

The verifier answers every conversation of a round in one batched generation (models.acceptance_tf);
its answers feed the next round's conversations (MT-Bench's turn 2). Each draft is then measured on
the stored trajectories: a few causal passes per batch instead of one verifier pass per draft step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polyspec.models.acceptance import PromptAcceptance
from polyspec.models.acceptance_tf import TeacherForcedAcceptance
from polyspec.models.draft_build import load_draft
from polyspec.models.drafts import inspect_draft
from polyspec.models.hidden import default_device, load_verifier_model
from polyspec.training.benchmarks import BenchPrompt
from polyspec.training.eval_options import conversations

if TYPE_CHECKING:
    from polyspec.training.eval_options import DraftChoice, EvalOptions

Scored = list[tuple[list[int], dict[str, PromptAcceptance]]]


def _torch_dtype(name: str | None, device: str) -> Any:
    import torch

    if name is None:  # bf16 only where it is fast and exact enough: GPUs; CPUs get float32
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return getattr(torch, name)
    except AttributeError:
        from polyspec.training.eval_options import EvalOptionError

        raise EvalOptionError(f"--dtype {name!r} is not a torch dtype (bfloat16, float16, float32)") from None


def aux_layers(drafts: Sequence[DraftChoice], verifier_path: Any) -> list[int]:
    """The verifier layers every draft reads; trajectories store those states once for all drafts."""
    layers = {d.name: tuple(inspect_draft(d.path).aux_layer_ids or ()) for d in drafts}
    if len(set(layers.values())) != 1:
        from polyspec.training.eval_options import EvalOptionError

        raise EvalOptionError(f"these drafts read different verifier layers, evaluate them separately: {layers}")
    found = next(iter(layers.values()))
    if found:
        return list(found)

    return list(load_draft(drafts[0].path, verifier_path).config.eagle_aux_hidden_state_layer_ids)


class OfflineScorer:
    """The verifier's answers to every item (all turns, batched), ready to score any number of drafts on them."""

    def __init__(self, verifier: Any, items: Sequence[BenchPrompt], options: EvalOptions,
                 aux_layer_ids: Sequence[int]) -> None:
        t0 = time.time()
        self.verifier, self.items, self.options = verifier, list(items), options
        self.device = options.device or default_device()
        self.dtype = _torch_dtype(options.dtype, self.device)
        model, self.tokenizer = load_verifier_model(verifier.path, device=self.device, dtype=self.dtype)
        self.tf = TeacherForcedAcceptance(model, self.tokenizer, aux_layer_ids, k=options.k,
                                          max_new_tokens=options.max_new_tokens)
        self.seconds = {"load": round(time.time() - t0, 1)}
        t1 = time.time()
        where = conversations(self.items, self._answer_round)
        self.located = [where[(it.id, it.turn)] for it in self.items]
        self.seconds["answers"] = round(time.time() - t1, 1)

    def _answer_round(self, convs: list[list[dict[str, str]]]) -> list[str]:
        group = f"round{len(self.tf.groups) + 1}"
        # the teacher-forced pass holds every layer's states of a whole batch: 8k tokens are ~0.6 GB in float32
        max_tokens = 65536 if self.device.startswith("cuda") else 8192
        trajs = self.tf.add_groups({group: convs}, batch_size=self.options.batch_size, max_batch_tokens=max_tokens,
                                   progress=self.options.progress)[group]
        return [self.tokenizer.decode(self.tf.answer_ids(t), skip_special_tokens=True) for t in trajs]

    def trajectory(self, index: int) -> Any:
        """The verifier's trajectory (models.acceptance_tf.Trajectory) of item ``index``."""
        r, i = self.located[index]
        return self.tf.groups[f"round{r}"][i]

    def answer_ids(self, index: int) -> list[int]:
        return self.tf.answer_ids(self.trajectory(index))

    def score(self, draft: Any) -> list[PromptAcceptance]:
        """One loaded draft (models.draft_build.load_draft) on every item, in item order."""
        draft = draft.to(device=self.device, dtype=self.dtype)
        batch = max(1, self.options.batch_size // 2)
        rounds = sorted({r for r, _ in self.located})
        per_round = {r: self.tf.measure(draft, f"round{r}", batch_size=batch).details for r in rounds}
        return [per_round[r][i] for r, i in self.located]

    def score_path(self, path: Path) -> list[PromptAcceptance]:
        return self.score(load_draft(path, self.verifier.path))

    def close(self) -> None:
        """Free the stored hidden states (on a GPU they hold most of its memory)."""
        import torch

        self.tf.groups.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def score_offline(drafts: Sequence[DraftChoice], verifier: Any, items: Sequence[BenchPrompt],
                  options: EvalOptions) -> tuple[Scored, dict[str, float]]:
    """Per item: (the verifier's answer ids, draft name -> its histogram on that answer); and timings."""
    scorer = OfflineScorer(verifier, items, options, aux_layers(drafts, verifier.path))
    out: Scored = [(scorer.answer_ids(i), {}) for i in range(len(items))]
    seconds = dict(scorer.seconds)
    for d in drafts:
        t0 = time.time()
        for (_, per), detail in zip(out, scorer.score_path(d.path), strict=True):
            per[d.name] = detail
        seconds[f"draft {d.name}"] = round(time.time() - t0, 1)
    scorer.close()
    return out, seconds
