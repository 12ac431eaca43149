"""Stage 4: token frequencies over assistant tokens, the draft vocabulary, and the draft training starts from.

Outputs (speculators' own file formats, so ``speculators train --t2d-path/--d2t-path`` takes them):
  token_freq.pt   {target token id: count} over assistant tokens of target-language answers
  t2d.npy, d2t.npy  bool mask over the verifier vocabulary / offsets (target_id = i + d2t[i])
  coverage.json   share of target-language assistant tokens each candidate vocabulary covers
  init_draft/     the draft the fit stage starts from, its frozen lm_head sliced from the verifier by t2d

Vocabulary source (RunConfig.vocab_source): ``parent`` keeps the parent draft's vocabulary (finetune),
``english`` takes the verifier's English top-N (models.vocab_ref), ``data`` ranks the target language's
answer tokens and tops up with the parent's, then English, ids when the language has fewer distinct tokens.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rich.table import Table

from polyspec.training.config import RunConfig
from polyspec.training.errors import ParentDraftError
from polyspec.training.prompts import read_jsonl
from polyspec.core.atomic import atomic_write_json
from polyspec.models.draft_build import (
    build_draft_model, load_draft, reslice_lm_head, save_draft, verifier_lm_head_weight, vocab_mappings,
)
from polyspec.models.drafts import draft_token_ids
from polyspec.models.vocab_ref import english_top_token_ids
from polyspec.training.runs import console

DEFAULT_VOCAB_SIZE = 8192  # a one-language draft's vocabulary when neither --draft-vocab-size nor a parent sets it


def count_tokens(rows: list[dict[str, Any]]) -> Counter[int]:
    """Frequencies of assistant tokens (loss_mask == 1) — speculators' token_freq definition."""
    freq: Counter[int] = Counter()
    for row in rows:
        freq.update(t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m)
    return freq


def rank_with_topup(freq: Counter[int], size: int, topups: list[list[int]], vocab_size: int) -> list[int]:
    """The ``size`` most frequent ids, then ids from each top-up list in order, then ids 0.. (speculators' fallback)."""
    chosen = [tid for tid, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:size]]
    seen = set(chosen)
    for source in [*topups, range(vocab_size)]:
        for tid in source:
            if len(chosen) >= size:
                break
            if tid not in seen:
                seen.add(tid)
                chosen.append(int(tid))
    return sorted(chosen)


def coverage(freq: Counter[int], vocab: set[int]) -> float:
    total = sum(freq.values())
    return round(sum(c for t, c in freq.items() if t in vocab) / total, 4) if total else 0.0


def _select(cfg: RunConfig, freq: Counter[int], verifier: Any, parent_ids: list[int] | None, size: int) -> list[int]:
    source = cfg.vocab_source
    if source == "parent":
        if parent_ids is None:
            raise ParentDraftError(f"mode {cfg.mode!r} keeps the parent's vocabulary but no parent draft was given")
        return parent_ids
    english = english_top_token_ids(verifier.path, size)
    if source == "english":
        return english
    topups = [parent_ids, english] if parent_ids else [english]
    distinct = len(freq)
    if distinct < size:
        console.print(f"{cfg.language} answers hold {distinct} distinct tokens; topping up to {size} with "
                      f"{'parent/' if parent_ids else ''}English ids")
    return rank_with_topup(freq, size, topups, verifier.vocab_size)


def build_vocab(out_dir: Path, answers_path: Path, cfg: RunConfig, verifier: Any, parent: Path | None,
                aux_layer_ids: list[int]) -> dict[str, Any]:
    import numpy as np
    import torch

    rows = [r for r in read_jsonl(answers_path) if not r.get("replay")]
    freq = count_tokens(rows)
    torch.save(dict(freq), out_dir / "token_freq.pt")
    parent_ids = draft_token_ids(parent) if parent else None
    size = cfg.vocab.draft_vocab_size or (len(parent_ids) if parent_ids else DEFAULT_VOCAB_SIZE)
    if cfg.mode == "finetune" and parent_ids and cfg.vocab.draft_vocab_size not in (None, len(parent_ids)):
        raise ParentDraftError(f"mode finetune keeps the parent's {len(parent_ids)}-token vocabulary; "
                               f"--draft-vocab-size {cfg.vocab.draft_vocab_size} needs a from-scratch mode")
    ids = _select(cfg, freq, verifier, parent_ids, size)
    d2t, t2d = vocab_mappings(ids, verifier.vocab_size)
    np.save(out_dir / "t2d.npy", t2d.numpy())
    np.save(out_dir / "d2t.npy", d2t.numpy())
    report = _coverage_report(cfg, freq, set(ids), parent_ids, verifier, len(ids))
    atomic_write_json(out_dir / "coverage.json", report)
    _init_draft(out_dir / "init_draft", cfg, verifier, parent, ids, t2d, d2t, aux_layer_ids)
    return {"draft_vocab_size": len(ids), "source": cfg.vocab_source, "coverage": report["coverage"],
            "distinct_tokens": len(freq), "assistant_tokens": sum(freq.values()),
            "vocab_changed": parent_ids is not None and ids != parent_ids}


def _coverage_report(cfg: RunConfig, freq: Counter[int], ids: set[int], parent_ids: list[int] | None,
                     verifier: Any, size: int) -> dict[str, Any]:
    rows = {"draft (new)": coverage(freq, ids)}
    if parent_ids is not None:
        rows["parent draft"] = coverage(freq, set(parent_ids))
    rows[f"English top-{size}"] = coverage(freq, set(english_top_token_ids(verifier.path, size)))
    table = Table(title=f"coverage of {cfg.language} assistant tokens ({sum(freq.values())} tokens, {len(freq)} distinct)")
    table.add_column("vocabulary")
    table.add_column("coverage", justify="right")
    for name, value in rows.items():
        table.add_row(name, f"{value:.1%}")
    console.print(table)
    return {"language": cfg.language, "draft_vocab_size": size, "coverage": rows}


def _init_draft(out: Path, cfg: RunConfig, verifier: Any, parent: Path | None, ids: list[int], t2d: Any, d2t: Any,
                aux_layer_ids: list[int]) -> None:
    """Save the starting draft: the parent (finetune) or a fresh one, lm_head re-sliced whenever t2d changed."""
    import torch

    if cfg.mode == "finetune":
        model = load_draft(parent, verifier.path)
        if not torch.equal(model.t2d.cpu(), t2d):
            with torch.no_grad():
                model.t2d.copy_(t2d)
                model.d2t.copy_(d2t)
            reslice_lm_head(model, verifier_lm_head_weight(verifier.path), t2d)
    else:
        model = build_draft_model(verifier.path, t2d_token_ids=ids, num_layers=cfg.fit.num_layers, seed=cfg.seed,
                                  aux_layer_ids=aux_layer_ids, k=cfg.eval.k)
    save_draft(model, out)
