from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polyspec.models.drafts import (
    DraftError, DraftInvalid, draft_tensor_shapes, draft_token_ids, inspect_draft, load_t2d, max_draft_vocab,
    predict_draft_bytes, vocab_size_within,
)
from polyspec.models.shipped import MAX_WEIGHTS_BYTES, checkout_drafts


@pytest.fixture()
def draft_copy(base_draft_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "draft"
    shutil.copytree(base_draft_dir, out)
    return out


def _edit_config(path: Path, **changes: object) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_good_draft(base_draft_dir: Path, verifier) -> None:
    info = inspect_draft(base_draft_dir, verifier)
    assert info.architecture == "Eagle3DraftModel"
    assert (info.target_vocab_size, info.draft_vocab_size, info.hidden_size) == (49152, 8192, 576)
    assert info.num_layers == 1 and info.k == 3
    assert info.aux_layer_ids and all(0 <= i < 30 for i in info.aux_layer_ids)
    assert info.has_embed_tokens is False
    t2d = load_t2d(base_draft_dir)
    assert t2d.dtype == np.bool_ and t2d.shape == (49152,) and int(t2d.sum()) == 8192
    ids = draft_token_ids(base_draft_dir)
    assert len(ids) == 8192 and ids == sorted(ids) and 2 in ids
    assert json.loads(json.dumps(info.to_json()))["draft_vocab_size"] == 8192


def test_missing_config(draft_copy: Path) -> None:
    (draft_copy / "config.json").unlink()
    with pytest.raises(DraftInvalid, match="no config.json"):
        inspect_draft(draft_copy)
    with pytest.raises(DraftInvalid, match="does not exist"):
        inspect_draft(draft_copy / "nope")


def test_missing_or_truncated_weights(draft_copy: Path) -> None:
    weights = draft_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(DraftInvalid, match="safetensors"):
        inspect_draft(draft_copy)
    weights.unlink()
    with pytest.raises(DraftInvalid, match="lacks weight file"):
        inspect_draft(draft_copy)


def test_not_an_eagle3_draft(draft_copy: Path, verifier) -> None:
    shutil.copy(verifier.path / "config.json", draft_copy / "config.json")
    with pytest.raises(DraftInvalid, match="speculators_config"):
        inspect_draft(draft_copy)


def test_draft_vocab_disagrees_with_tensors(draft_copy: Path) -> None:
    _edit_config(draft_copy, draft_vocab_size=4096)
    with pytest.raises(DraftInvalid, match="expected \\[4096"):
        inspect_draft(draft_copy)


def test_wrong_verifier_vocab_or_hidden(base_draft_dir: Path, verifier) -> None:
    with pytest.raises(DraftInvalid, match="32000"):
        inspect_draft(base_draft_dir, dataclasses.replace(verifier, vocab_size=32000))
    with pytest.raises(DraftInvalid, match="hidden size"):
        inspect_draft(base_draft_dir, dataclasses.replace(verifier, hidden_size=1024))
    with pytest.raises(DraftInvalid, match="aux layer"):
        inspect_draft(base_draft_dir, dataclasses.replace(verifier, num_layers=4))


def test_d2t_t2d_disagreement(draft_copy: Path) -> None:
    # numpy has no bfloat16, so this rewrite goes through safetensors' torch API (tests may use torch).
    from safetensors.torch import load_file, save_file

    weights = draft_copy / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["d2t"] = tensors["d2t"].clone()
    tensors["d2t"][5] += 1
    save_file(tensors, str(weights))
    with pytest.raises(DraftInvalid, match="d2t and t2d disagree"):
        inspect_draft(draft_copy)


def test_drafts_module_is_torch_free() -> None:
    code = "import sys, models.drafts, models.checksums, models.vllm_engine; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("draft", checkout_drafts(), ids=lambda d: d.name)
def test_predicted_size_of_each_shipped_draft(draft, verifier) -> None:
    """From the verifier's config, the vocabulary and the layers alone: every tensor the shipped draft holds, and
    its weights file's size within 1 %."""
    info = inspect_draft(draft.path, verifier)
    real = (draft.path / "model.safetensors").stat().st_size
    predicted = predict_draft_bytes(verifier.path, info.draft_vocab_size, info.num_layers)
    assert abs(predicted - real) <= 0.01 * real, (draft.name, predicted, real)
    shapes = draft_tensor_shapes(verifier.path, info.draft_vocab_size, info.num_layers)
    assert {name: shape for name, (_, shape) in shapes.items()} == info.tensor_shapes


def test_largest_vocabulary_within_a_limit(verifier) -> None:
    multi = next(d for d in checkout_drafts() if d.role == "multilingual")
    room = max_draft_vocab(verifier.path, MAX_WEIGHTS_BYTES)
    assert room == vocab_size_within(multi.path, MAX_WEIGHTS_BYTES) == 12729  # a token: 576 bf16 + one int64 = 1,160 B
    assert predict_draft_bytes(verifier.path, room) <= MAX_WEIGHTS_BYTES < predict_draft_bytes(verifier.path, room + 1)
    assert predict_draft_bytes(verifier.path, 8192, num_layers=2) > MAX_WEIGHTS_BYTES  # a second layer: 7.1 MB
    assert max_draft_vocab(verifier.path, MAX_WEIGHTS_BYTES, num_layers=9) == 0
    assert predict_draft_bytes(verifier.path, 8192, dtype="float32") > 1.9 * predict_draft_bytes(verifier.path, 8192)


def test_prediction_refuses_an_unknown_dtype_or_a_config_without_sizes(verifier) -> None:
    with pytest.raises(DraftError, match="draft dtype 'int4'"):
        predict_draft_bytes(verifier.path, 8192, dtype="int4")
    with pytest.raises(DraftError, match="lacks the sizes of a decoder"):
        predict_draft_bytes({"vocab_size": 100}, 16)
