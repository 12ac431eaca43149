"""The draft a run will make, sized from the configs before any stage: what passes, and what is refused with the
input named (the CLI's refusals, with no run left behind, are in test_multilingual.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polyspec.core.settings import reset_settings_cache
from polyspec.training.config import RunConfig
from polyspec.training.draft_size import check_draft_size
from polyspec.training.errors import DraftTooLarge
from polyspec.training.multilingual import parse_mix

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "drafts"


def _config(**fields: object) -> RunConfig:
    return RunConfig.model_validate({"run_id": "size", "language": "fr", **fields})


def test_defaults_and_the_shipped_shapes_fit(verifier, base_draft_dir: Path) -> None:
    plan = check_draft_size(_config(mode="from-scratch"), verifier, None)
    assert (plan.vocab_size, plan.num_layers, plan.bytes) == (8192, 1, 19_735_928)  # the shipped specialists' size
    finetune = check_draft_size(_config(parent_draft=str(base_draft_dir)), verifier, base_draft_dir)
    assert (finetune.vocab_size, finetune.num_layers) == (8192, 1)
    mixed = check_draft_size(_config(language="mul", mix=parse_mix("en,fr", None, None)), verifier, None)
    assert (mixed.vocab_size, mixed.bytes) == (12288, 24_487_288)  # the shipped multilingual draft's size


def test_one_language_from_scratch_with_too_many_tokens_or_layers(verifier) -> None:
    big = _config(mode="from-scratch-custom-vocab", vocab={"draft_vocab_size": 20000})
    with pytest.raises(DraftTooLarge, match=r"^--draft-vocab-size 20000 gives a 33\.4 MB draft; the limit is 25 MB "
                                            r"\(at most 12,729 tokens with 1 layer\)"):
        check_draft_size(big, verifier, None)
    deep = _config(mode="from-scratch", fit={"num_layers": 2})
    with pytest.raises(DraftTooLarge, match=r"^the default 8,192-token vocabulary with --layers 2 gives a 26\.8 MB "
                                            r"draft; the limit is 25 MB \(at most 6,625 tokens with 2 layers\)"):
        check_draft_size(deep, verifier, None)
    with pytest.raises(DraftTooLarge, match=r"no vocabulary fits with 9 layers"):
        check_draft_size(_config(mode="from-scratch", fit={"num_layers": 9}), verifier, None)


def test_warm_start_grown_beyond_the_limit(verifier) -> None:
    """The shipped multilingual draft (12,288 tokens, 24.5 MB) grown to 14,000 tokens is refused; 12,729 fit."""
    parent = SHIPPED / "smollm2-135m-instruct-multi"
    mix = parse_mix("en,fr,pt", None, None)
    grown = _config(language="mul", mode="finetune", parent_draft=str(parent), mix=mix, vocab={"draft_vocab_size": 14000})
    with pytest.raises(DraftTooLarge, match=r"^--draft-vocab-size 14000 gives a 26\.5 MB draft; the limit is 25 MB "
                                            r"\(at most 12,729 tokens with 1 layer\)"):
        check_draft_size(grown, verifier, parent)
    fits = grown.model_copy(update={"vocab": grown.vocab.model_copy(update={"draft_vocab_size": 12729})})
    assert check_draft_size(fits, verifier, parent).bytes <= 25_000_000


def test_a_parent_already_over_the_limit_is_named(verifier, base_draft_dir: Path, tmp_path: Path) -> None:
    deep = tmp_path / "deep-parent"
    shutil.copytree(base_draft_dir, deep)
    config = json.loads((deep / "config.json").read_text())
    config["transformer_layer_config"]["num_hidden_layers"] = 2  # its weights file is not read: the config says 2
    (deep / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftTooLarge, match=rf"^parent draft {deep} \(8,192 tokens, 2 layers\) gives a 26\.8 MB draft"):
        check_draft_size(_config(parent_draft=str(deep)), verifier, deep)


def test_the_limit_is_a_setting(verifier, monkeypatch: pytest.MonkeyPatch) -> None:
    big = _config(mode="from-scratch", vocab={"draft_vocab_size": 20000})
    monkeypatch.setenv("POLYSPEC_MAX_DRAFT_BYTES", "40000000")
    reset_settings_cache()
    try:
        assert check_draft_size(big, verifier, None).bytes == 33_433_208
        monkeypatch.setenv("POLYSPEC_MAX_DRAFT_BYTES", "19000000")
        reset_settings_cache()
        with pytest.raises(DraftTooLarge, match=r"the default 8,192-token vocabulary gives a 19\.7 MB draft; the limit "
                                                r"is 19 MB \(at most 7,557 tokens with 1 layer\)"):
            check_draft_size(_config(mode="from-scratch"), verifier, None)
    finally:
        monkeypatch.delenv("POLYSPEC_MAX_DRAFT_BYTES")
        reset_settings_cache()
