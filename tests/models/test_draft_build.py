"""Draft construction, saving and loading against the bundled SmolLM2 verifier."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from polyspec.models.draft_build import (
    DraftBuildError,
    build_draft_model,
    create_draft,
    load_draft,
    reslice_lm_head,
    save_draft,
    verifier_lm_head_weight,
    vocab_mappings,
)

VOCAB = 49152


def _vocab(n: int, seed: int) -> list[int]:
    return sorted(random.Random(seed).sample(range(VOCAB), n))


@pytest.fixture(scope="module")
def token_ids() -> list[int]:
    return _vocab(8192, seed=1)


@pytest.fixture(scope="module")
def draft_dir(verifier, token_ids, tmp_path_factory) -> Path:
    return create_draft(verifier.path, tmp_path_factory.mktemp("d") / "draft", t2d_token_ids=token_ids, seed=0)


@pytest.fixture(scope="module")
def head(verifier) -> torch.Tensor:
    return verifier_lm_head_weight(verifier.path)


def test_vocab_mappings_follow_speculators_layout():
    ids = [3, 7, 8, 100]
    d2t, t2d = vocab_mappings([100, 3, 8, 7], target_vocab_size=120)
    assert (torch.arange(4) + d2t).tolist() == ids
    assert t2d.dtype == torch.bool and t2d.shape == (120,)
    assert t2d.nonzero().flatten().tolist() == ids


@pytest.mark.parametrize("ids", [[], [1, 1, 2], [-1, 4], [5, VOCAB]])
def test_vocab_mappings_reject_bad_ids(ids):
    with pytest.raises(DraftBuildError):
        vocab_mappings(ids, target_vocab_size=VOCAB)


def test_saved_draft_is_small_and_has_no_embeddings(draft_dir, token_ids):
    weights = draft_dir / "model.safetensors"
    assert weights.stat().st_size < 25 * 1024 * 1024
    with safe_open(str(weights), framework="pt") as f:
        keys = set(f.keys())
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    assert not any(k.startswith("embed_tokens") or k.startswith("verifier_") for k in keys)
    assert {"lm_head.weight", "fc.weight", "layers.0.self_attn.q_proj.weight"} <= keys
    assert (torch.arange(len(token_ids)) + d2t).tolist() == token_ids
    assert t2d.nonzero().flatten().tolist() == token_ids
    cfg = json.loads((draft_dir / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["draft_vocab_size"] == 8192
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 1
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3


def test_loaded_draft_has_verifier_rows_and_embeddings(draft_dir, verifier, token_ids, head):
    model = load_draft(draft_dir, verifier.path)
    assert torch.equal(model.lm_head.weight, head[model.t2d].float())
    assert torch.equal(model.lm_head.weight, head[token_ids].float())
    assert torch.equal(model.verifier_lm_head.weight, model.lm_head.weight)
    assert not model.embed_tokens.weight.isnan().any()
    assert torch.equal(model.embed_tokens.weight, head.float())  # SmolLM2 ties lm_head and embeddings
    assert model.config.eagle_aux_hidden_state_layer_ids == [2, 15, 27]


def test_same_seed_same_weights_other_seed_differs(verifier, token_ids):
    a = build_draft_model(verifier.path, t2d_token_ids=token_ids, seed=3)
    b = build_draft_model(verifier.path, t2d_token_ids=token_ids, seed=3)
    c = build_draft_model(verifier.path, t2d_token_ids=token_ids, seed=4)
    assert torch.equal(a.fc.weight, b.fc.weight)
    assert not torch.equal(a.fc.weight, c.fc.weight)


def test_trained_weights_survive_and_vocab_change_is_resliced(draft_dir, verifier, head, tmp_path):
    model = load_draft(draft_dir, verifier.path)
    with torch.no_grad():
        model.fc.weight.mul_(2.0)
    expected_fc = model.fc.weight.to(torch.bfloat16)
    out = save_draft(model, tmp_path / "trained")
    again = load_draft(out, verifier.path)
    assert torch.equal(again.fc.weight, expected_fc.float())

    new_ids = _vocab(8192, seed=2)
    d2t, t2d = vocab_mappings(new_ids, VOCAB)
    again.load_state_dict({"d2t": d2t, "t2d": t2d}, strict=False)
    reslice_lm_head(again, head, t2d)
    assert torch.equal(again.lm_head.weight, head[new_ids].float())


def test_custom_aux_layers_and_two_layers(verifier, token_ids, tmp_path):
    out = create_draft(
        verifier.path, tmp_path / "d2", t2d_token_ids=token_ids, num_layers=2, aux_layer_ids=[1, 10, 20], k=5
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 10, 20]
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 2
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5


def test_save_overwrites_atomically_and_failure_keeps_old(draft_dir, verifier, tmp_path, monkeypatch):
    model = load_draft(draft_dir, verifier.path)
    out = save_draft(model, tmp_path / "x")
    before = (out / "model.safetensors").read_bytes()

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(model, "save_pretrained", boom)
    with pytest.raises(OSError):
        save_draft(model, out)
    assert (out / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]  # no temp dir left behind


def test_bad_paths_raise_clear_errors(verifier, tmp_path):
    with pytest.raises(DraftBuildError, match="config.json"):
        create_draft(tmp_path / "nowhere", tmp_path / "o", t2d_token_ids=[1, 2])
    with pytest.raises(DraftBuildError, match="not a saved draft"):
        load_draft(tmp_path, verifier.path)
    with pytest.raises(DraftBuildError):
        create_draft(verifier.path, tmp_path / "o", t2d_token_ids=[1, 2], aux_layer_ids=[2, 99, 3])


def test_vllm_reads_the_draft_config(draft_dir):
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    raw = json.loads((draft_dir / "config.json").read_text())
    cfg = SpeculatorsConfig.from_pretrained(str(draft_dir))
    assert cfg.architectures == ["Eagle3LlamaForCausalLM"]
    assert cfg.draft_vocab_size == 8192
    assert cfg.norm_before_fc and cfg.norm_output and cfg.norm_before_residual
    assert SpeculatorsConfig.extract_vllm_speculative_config(raw) == {"method": "eagle3", "num_speculative_tokens": 3}
