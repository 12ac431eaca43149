"""The drafts shipped in models/drafts/: small, checksummed, valid for the bundled verifier."""

from __future__ import annotations

import json
import shutil

import pytest

from polyspec.models.drafts import inspect_draft
from polyspec.models.shipped import (
    MANIFEST, MAX_WEIGHTS_BYTES, ShippedDraftError, checkout_drafts, shipped_drafts, shipped_for_language,
)


def test_manifest_lists_english_base_and_french_finetune():
    drafts = {d.name: d for d in shipped_drafts("smollm2-135m-instruct")}
    assert set(drafts) >= {"smollm2-135m-instruct-en", "smollm2-135m-instruct-fr"}
    fr = shipped_for_language("smollm2-135m-instruct", "fr")
    assert fr is not None and fr.parent == "smollm2-135m-instruct-en" and fr.role == "finetuned"
    assert shipped_for_language("smollm2-135m-instruct", "xx") is None


@pytest.mark.parametrize("draft", checkout_drafts(), ids=lambda d: d.name)
def test_shipped_draft_is_small_checksummed_and_valid(draft, verifier):
    draft.verify()
    size = sum(p.stat().st_size for p in draft.path.iterdir())
    assert size <= 25 * 1024 * 1024, f"{draft.name} is {size} bytes"
    info = inspect_draft(draft.path, verifier)
    assert not info.has_embed_tokens  # vLLM shares the verifier's embeddings
    assert info.target_vocab_size == verifier.vocab_size and info.k == 3
    by_lang = {e["language"]: e for e in draft.evaluations}
    assert set(by_lang) >= {"en", "fr"}
    for e in draft.evaluations:
        assert abs(e["mean_acceptance_length"] - (1 + sum(e["acceptance"]))) < 1e-6


def test_french_finetune_beats_english_base_on_french():
    en = shipped_for_language("smollm2-135m-instruct", "en")
    fr = shipped_for_language("smollm2-135m-instruct", "fr")
    mal = lambda d, lang: next(e["mean_acceptance_length"] for e in d.evaluations if e["language"] == lang)  # noqa: E731
    assert mal(fr, "fr") > mal(en, "fr")


def test_damaged_shipped_draft_is_refused(tmp_path):
    root = tmp_path / "drafts"
    shutil.copytree(MANIFEST.parent, root)
    draft = shipped_drafts(manifest=root / "manifest.json")[0]
    with open(draft.path / "config.json", "a", encoding="utf-8") as fh:
        fh.write(" ")
    with pytest.raises(ShippedDraftError, match="config.json") as err:
        draft.verify()
    assert "polyspec models pull" in (err.value.hint or "")  # how to get an intact copy
    assert json.loads((root / "manifest.json").read_text())["drafts"]


def test_checkout_lists_every_draft_with_its_weights():
    """The checkout ships nine drafts, one made first for each MT-Bench language (the multilingual one for
    Japanese, and it lists all nine), each with a model card whose sha256 block is the manifest's; they stay out
    of the wheel (tests/test_install.py)."""
    listed = checkout_drafts()
    nine = sorted(["en", "fr", "de", "es", "it", "ru", "zh", "ja", "ko"])
    assert sorted(d.languages[0] for d in listed) == nine
    multi = [d for d in listed if d.role == "multilingual"]
    assert [sorted(d.languages) for d in multi] == [nine] and multi[0].languages[0] == "ja"
    assert [d.languages for d in listed if d.role != "multilingual"] == [[d.languages[0]] for d in listed
                                                                          if d.role != "multilingual"]
    assert shipped_for_language("smollm2-135m-instruct", "ja").name == multi[0].name  # what `polyspec demo` would serve
    for d in listed:
        d.verify()
        assert (d.path / "model.safetensors").stat().st_size <= MAX_WEIGHTS_BYTES
        card = (d.path / "README.md").read_text()
        assert all(sha in card for sha in d.checksums.values()), d.name
    assert sum((d.path / "model.safetensors").stat().st_size for d in listed) <= 200_000_000
    assert [d.name for d in shipped_drafts(home="/nonexistent-polyspec-home")] == [d.name for d in listed]
