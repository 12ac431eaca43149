"""Stage 4: token counting, vocabulary selection with top-up, lm_head re-slicing; parent-draft checks."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from polyspec.training.config import RunConfig
from polyspec.training.errors import ParentDraftError
from polyspec.training.vocab import build_vocab, count_tokens, coverage, rank_with_topup


def test_count_tokens_only_counts_assistant_tokens() -> None:
    rows = [{"input_ids": [5, 6, 7, 7], "loss_mask": [0, 0, 1, 1]}, {"input_ids": [5, 8], "loss_mask": [0, 1]}]
    assert count_tokens(rows) == Counter({7: 2, 8: 1})


def test_rank_with_topup_prefers_frequency_then_topup_lists() -> None:
    freq = Counter({40: 9, 30: 5, 20: 5})
    assert rank_with_topup(freq, 2, [], 100) == [20, 40]  # ties broken by id, output sorted
    assert rank_with_topup(freq, 5, [[99, 30, 98]], 100) == [20, 30, 40, 98, 99]
    assert rank_with_topup(freq, 6, [[99]], 100) == [0, 1, 20, 30, 40, 99]  # then speculators' 0.. fallback
    assert coverage(freq, {40}) == round(9 / 19, 4)


def _answers_from_prompts(prompts: Path, verifier_path: Path, out: Path) -> Path:
    """Tokenized prompt texts stand in for verifier answers: the vocab stage only counts tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(verifier_path))
    rows = []
    for line in prompts.read_text(encoding="utf-8").splitlines():
        ids = tok(json.loads(line)["prompt"], add_special_tokens=False).input_ids
        rows.append({"id": str(len(rows)), "input_ids": [1, *ids], "loss_mask": [0, *[1] * len(ids)]})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _lm_head_matches_verifier(draft_dir: Path, verifier_path: Path) -> tuple[torch.Tensor, bool]:
    from safetensors.torch import load_file

    from polyspec.models.draft_build import verifier_lm_head_weight

    weights = load_file(str(draft_dir / "model.safetensors"))
    t2d = weights["t2d"].bool()
    expected = verifier_lm_head_weight(verifier_path).to(weights["lm_head.weight"].dtype)[t2d]
    return t2d, torch.equal(weights["lm_head.weight"], expected)


def test_finetune_with_data_vocab_reslices_lm_head(verifier, base_draft_dir: Path, fr_prompts: Path,
                                                  tmp_path: Path) -> None:
    from polyspec.models.drafts import load_t2d

    answers = _answers_from_prompts(fr_prompts, verifier.path, tmp_path / "answers.jsonl")
    cfg = RunConfig(run_id="v", language="fr", mode="finetune", parent_draft=str(base_draft_dir),
                    vocab={"source": "data"})
    out = tmp_path / "vocab"
    out.mkdir()
    summary = build_vocab(out, answers, cfg, verifier, base_draft_dir, [2, 15, 27])
    assert summary["vocab_changed"] and summary["draft_vocab_size"] == 8192
    t2d, ok = _lm_head_matches_verifier(out / "init_draft", verifier.path)
    assert ok, "lm_head must equal verifier_lm_head[t2d] after the vocabulary changed"
    parent_t2d = torch.from_numpy(load_t2d(base_draft_dir))
    assert not torch.equal(t2d, parent_t2d)
    assert np.array_equal(np.load(out / "t2d.npy"), t2d.numpy())
    report = json.loads((out / "coverage.json").read_text())["coverage"]
    assert report["draft (new)"] >= report["parent draft"] and report["draft (new)"] > 0.99
    freq = torch.load(out / "token_freq.pt")
    assert sum(freq.values()) == summary["assistant_tokens"]


def test_custom_vocab_tops_up_and_finetune_keeps_parent_vocab(verifier, base_draft_dir: Path, fr_prompts: Path,
                                                              tmp_path: Path) -> None:
    from polyspec.models.drafts import draft_token_ids

    answers = _answers_from_prompts(fr_prompts, verifier.path, tmp_path / "answers.jsonl")
    seen = {t for r in map(json.loads, answers.read_text().splitlines()) for t in r["input_ids"][1:]}
    scratch = RunConfig(run_id="s", language="fr", mode="from-scratch-custom-vocab", vocab={"draft_vocab_size": 4096})
    (tmp_path / "s").mkdir()
    summary = build_vocab(tmp_path / "s", answers, scratch, verifier, None, [2, 15, 27])
    ids = draft_token_ids(tmp_path / "s" / "init_draft")
    assert len(ids) == 4096 and summary["distinct_tokens"] < 4096 and seen <= set(ids)
    assert _lm_head_matches_verifier(tmp_path / "s" / "init_draft", verifier.path)[1]
    keep = RunConfig(run_id="k", language="fr", mode="finetune", parent_draft=str(base_draft_dir))
    (tmp_path / "k").mkdir()
    assert not build_vocab(tmp_path / "k", answers, keep, verifier, base_draft_dir, [2, 15, 27])["vocab_changed"]
    assert draft_token_ids(tmp_path / "k" / "init_draft") == draft_token_ids(base_draft_dir)
    wrong = RunConfig(run_id="w", language="fr", mode="finetune", parent_draft=str(base_draft_dir),
                      vocab={"draft_vocab_size": 1024})
    (tmp_path / "w").mkdir()
    with pytest.raises(ParentDraftError, match="keeps the parent's 8192-token vocabulary"):
        build_vocab(tmp_path / "w", answers, wrong, verifier, base_draft_dir, [2, 15, 27])


def _tiny_verifier(verifier_path: Path, out: Path) -> Path:
    """A real (random) Llama with SmolLM2's tokenizer but another hidden size: a different verifier."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=49152, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (verifier_path / name).exists():
            shutil.copy(verifier_path / name, out / name)
    return out


def test_parent_draft_of_another_verifier_is_refused(verifier, tmp_path: Path, fr_prompts: Path) -> None:
    from polyspec.models.draft_build import create_draft
    from polyspec.training.pipeline import make_context, start_run

    other = _tiny_verifier(verifier.path, tmp_path / "tiny-verifier")
    foreign = create_draft(other, tmp_path / "foreign-draft", t2d_token_ids=list(range(512)), aux_layer_ids=[1, 3, 4])
    cfg = RunConfig(run_id="bad-parent", language="fr", verifier=str(verifier.path), parent_draft=str(foreign),
                    prompts={"files": [str(fr_prompts)]})
    run = start_run(cfg, home=tmp_path)
    with pytest.raises(ParentDraftError, match="cannot be used with verifier smollm2-135m-instruct"):
        make_context(run, home=tmp_path)
    orphan = RunConfig(run_id="no-parent", language="fr", verifier=str(verifier.path), mode="finetune")
    with pytest.raises(ParentDraftError, match="needs a parent draft"):
        make_context(start_run(orphan, home=tmp_path), home=tmp_path)
