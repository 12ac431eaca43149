"""The drafts shipped in models/drafts/: small, checksummed, valid for the bundled verifier."""

from __future__ import annotations

import json
import shutil

import pytest

from polyspec.models.drafts import inspect_draft
from polyspec.models.shipped import (
    MANIFEST, MAX_WEIGHTS_BYTES, ShippedDraft, ShippedDraftError, best_for_language, checkout_drafts, shipped_drafts,
    shipped_for_language,
)


def test_manifest_lists_english_base_and_french_finetune():
    drafts = {d.name: d for d in shipped_drafts("smollm2-135m-instruct")}
    assert set(drafts) >= {"smollm2-135m-instruct-en", "smollm2-135m-instruct-fr"}
    fr = shipped_for_language("smollm2-135m-instruct", "fr", specialist=True)
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
    fr = shipped_for_language("smollm2-135m-instruct", "fr", specialist=True)
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
    """The checkout ships nine drafts, one made for each MT-Bench language alone except Japanese, which only
    the multilingual draft serves (made for the nine and the nine other languages of the data pack), each with
    a model card whose sha256 block is the manifest's; they stay out of the wheel (tests/test_install.py)."""
    listed = checkout_drafts()
    nine = {"en", "fr", "de", "es", "it", "ru", "zh", "ja", "ko"}
    pack = nine | {"ar", "hi", "th", "pt", "id", "nl", "pl", "tr", "vi"}
    multi = [d for d in listed if d.role == "multilingual"]
    assert [set(d.languages) for d in multi] == [pack]
    specialists = [d for d in listed if d.role != "multilingual"]
    assert all(len(d.languages) == 1 for d in specialists)
    assert {d.languages[0] for d in specialists} == nine - {"ja"}
    for d in listed:
        d.verify()
        assert (d.path / "model.safetensors").stat().st_size <= MAX_WEIGHTS_BYTES
        card = (d.path / "README.md").read_text()
        assert all(sha in card for sha in d.checksums.values()), d.name
    assert sum((d.path / "model.safetensors").stat().st_size for d in listed) <= 200_000_000
    assert [d.name for d in shipped_drafts(home="/nonexistent-polyspec-home")] == [d.name for d in listed]


def test_the_draft_for_a_language_is_the_best_measured_one_made_for_it():
    """What `polyspec demo` and the fleet would serve: by measured acceptance among the drafts made for the
    language (the multilingual draft beats every specialist but English's), never by list position."""
    verifier = "smollm2-135m-instruct"
    by_lang = {lang: shipped_for_language(verifier, lang).name for lang in ("en", "fr", "ja", "ru")}
    assert by_lang == {"en": f"{verifier}-en", "fr": f"{verifier}-multi", "ja": f"{verifier}-multi",
                       "ru": f"{verifier}-multi"}
    assert shipped_for_language(verifier, "ru", specialist=True).name == f"{verifier}-ru"
    assert shipped_for_language(verifier, "ja", specialist=True) is None
    assert shipped_for_language(verifier, "pt").name == f"{verifier}-multi"  # a pack language: made for it
    assert shipped_for_language(verifier, "bn") is None  # made for no draft, whatever carries over


def _draft(name: str, languages: list[str], evaluations: list[dict]) -> ShippedDraft:
    return ShippedDraft(name=name, path=MANIFEST.parent / name, verifier="v", languages=languages, role="unknown",
                        parent=None, checksums={}, evaluations=evaluations)


def test_best_for_language_ignores_order_and_compares_on_a_shared_benchmark():
    ev = lambda lang, mal, bench="b", subset="all": {"language": lang, "mean_acceptance_length": mal,  # noqa: E731
                                                     "benchmark": bench, "subset": subset}
    multi = _draft("multi", ["ja", "fr", "en"], [ev("fr", 3.0), ev("en", 2.0), ev("fr", 9.0, subset="non_degenerate")])
    fr = _draft("fr", ["fr"], [ev("fr", 2.5), ev("fr", 3.5, bench="other")])
    bare = _draft("bare", ["fr"], [])
    for order in ([multi, fr, bare], [bare, fr, multi]):
        assert best_for_language(order, "fr").name == "multi"  # 3.0 > 2.5 on "b"; "other" is fr's alone
        assert best_for_language(order, "fr", specialist=True).name == "fr"
        assert best_for_language(order, "en").name == "multi"
        assert best_for_language(order, "ja").name == "multi"  # made for it, unmeasured: still the only one
    assert best_for_language([bare, _draft("bare2", ["fr", "de"], [])], "fr").name == "bare"  # fewer languages
    assert best_for_language([multi], "de") is None


@pytest.mark.parametrize(("languages", "error"), [("fr", "must be a list"), (["fr", 3], "must be a list"),
                                                   (["fr", "xq"], "unknown language code 'xq'")])
def test_a_manifest_with_bad_languages_is_refused(tmp_path, languages, error):
    from polyspec.core.errors import InvalidInput

    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"drafts": [{"name": "d", "verifier": "v", "languages": languages}]}))
    with pytest.raises(InvalidInput, match=error):
        checkout_drafts(manifest=manifest)


def test_manifest_languages_are_normalised_codes(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"drafts": [{"name": "d", "verifier": "v", "languages": ["FRA", "en", "fr"]}]}))
    assert [d.languages for d in checkout_drafts(manifest=manifest)] == [["fr", "en"]]
