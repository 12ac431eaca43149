"""The size of the draft a run will make, known before any stage runs, and the refusal of one over the limit.

A draft's weights file is its tensors and their header (models.drafts.predict_draft_bytes, exact for the drafts
models.draft_build.save_draft writes): for SmolLM2-135M, 10.2 MB for one decoder layer and 1,160 bytes per
vocabulary token (an lm_head row and a d2t entry). The vocabulary and the layers come from the same rules the
vocab stage applies (training.vocab, training.multilingual): ``--draft-vocab-size``, else the parent's vocabulary
(grown to the merged default in a multilingual run), else the default; the parent's layers when the draft
starts from its weights (finetune, or a multilingual warm start), else ``--layers``. The limit is
``POLYSPEC_MAX_DRAFT_BYTES`` (core.settings, default 25 MB, the cap on a draft shipped in git).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyspec.core.settings import get_settings
from polyspec.models.drafts import inspect_draft, max_draft_vocab, predict_draft_bytes
from polyspec.training.config import RunConfig
from polyspec.training.errors import DraftTooLarge
from polyspec.training.multilingual import MIX_VOCAB_SIZE
from polyspec.training.vocab import DEFAULT_VOCAB_SIZE


@dataclass(frozen=True)
class PlannedDraft:
    """The draft a run will make: its vocabulary and layers, what set each, and its weights file's bytes."""

    vocab_size: int
    num_layers: int
    bytes: int
    inputs: str  # the inputs that set the vocabulary and the layers, as the user gave them


def planned_draft(cfg: RunConfig, verifier: Any, parent: Path | None) -> PlannedDraft:
    """The draft ``cfg`` makes for ``verifier`` (a VerifierInfo or its directory) from ``parent`` (a resolved
    draft directory, or None), predicted from their configs alone."""
    info = inspect_draft(parent) if parent is not None else None
    parent_name = f"parent draft {cfg.parent_draft}"
    vocab, vocab_from = _vocab(cfg, info.draft_vocab_size if info else None, parent_name)
    keeps_layers = info is not None and (cfg.mix is not None or cfg.mode == "finetune")  # starts from its weights
    layers = info.num_layers if info is not None and keeps_layers else cfg.fit.num_layers
    if vocab_from is None and keeps_layers:
        inputs = f"{parent_name} ({vocab:,} tokens, {_layers(layers)})"
    else:
        layers_from = f"the {_layers(layers)} of {parent_name}" if keeps_layers else f"--layers {layers}"
        inputs = (vocab_from or f"the {vocab:,}-token vocabulary of {parent_name}") + \
            (f" with {layers_from}" if layers != 1 else "")
    return PlannedDraft(vocab, layers, predict_draft_bytes(_config_dir(verifier), vocab, layers), inputs)


def _vocab(cfg: RunConfig, parent_vocab: int | None, parent_name: str) -> tuple[int, str | None]:
    """The draft's vocabulary size by the vocab stage's rules, and the input that sets it (None: the parent's own)."""
    if cfg.mix is None and cfg.vocab_source == "parent" and parent_vocab is not None:
        return parent_vocab, None  # kept whatever its size
    given = cfg.vocab.draft_vocab_size
    if given:
        return given, f"--draft-vocab-size {given}"
    if parent_vocab is None:
        default = MIX_VOCAB_SIZE if cfg.mix is not None else DEFAULT_VOCAB_SIZE
        return default, f"the default {default:,}-token {'merged ' if cfg.mix is not None else ''}vocabulary"
    if cfg.mix is not None and parent_vocab < MIX_VOCAB_SIZE:
        return MIX_VOCAB_SIZE, (f"the default {MIX_VOCAB_SIZE:,}-token merged vocabulary, grown from the "
                                f"{parent_vocab:,} of {parent_name},")
    return parent_vocab, None


def check_draft_size(cfg: RunConfig, verifier: Any, parent: Path | None) -> PlannedDraft:
    """The planned draft, or DraftTooLarge naming the input when its weights would exceed POLYSPEC_MAX_DRAFT_BYTES."""
    plan = planned_draft(cfg, verifier, parent)
    limit = get_settings().max_draft_bytes
    if plan.bytes <= limit:
        return plan
    room = max_draft_vocab(_config_dir(verifier), limit, plan.num_layers)
    layers = _layers(plan.num_layers)
    fits = f"at most {room:,} tokens with {layers}" if room else f"no vocabulary fits with {layers}"
    raise DraftTooLarge(f"{plan.inputs} gives a {plan.bytes / 1e6:.1f} MB draft; the limit is {limit / 1e6:g} MB ({fits}); "
                        "POLYSPEC_MAX_DRAFT_BYTES sets the limit")


def _layers(n: int) -> str:
    return f"{n} layer{'s' if n != 1 else ''}"


def _config_dir(verifier: Any) -> Path:
    return Path(getattr(verifier, "path", verifier))
