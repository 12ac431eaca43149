from __future__ import annotations

import json

import pytest

from polyspec.models import vocab_ref as R


def test_frequency_table_matches_bundled_tokenizer(verifier) -> None:
    table = json.loads(R.EN_FREQ_FILE.read_text())
    assert table["tokenizer_sha256"] == R.tokenizer_fingerprint(verifier.path)
    assert R.EN_FREQ_FILE.stat().st_size < 1_000_000
    assert table["num_tokens"] == sum(table["counts"].values())


def test_english_top_ids_follow_the_table(verifier) -> None:
    ids = R.english_top_token_ids(verifier.path, 1000)
    assert len(ids) == 1000 == len(set(ids)) and ids == sorted(ids)
    assert 2 in ids  # <|im_end|>, the eos a draft must be able to propose
    counts = {int(k): v for k, v in json.loads(R.EN_FREQ_FILE.read_text())["counts"].items()}
    top = sorted(counts, key=lambda i: (-counts[i], i))[:500]
    assert set(top) <= set(ids)
    tok = R.load_tokenizer(verifier.path)
    the = R.encode_ids(tok, " the")
    assert len(the) == 1 and the[0] in ids


def test_english_top_ids_fill_beyond_the_table(verifier) -> None:
    ids = R.english_top_token_ids(verifier.path, 49152)
    assert ids == list(range(49152))
    with pytest.raises(R.VocabRefError):
        R.english_top_token_ids(verifier.path, 49153)


def test_fallback_counts_mtbench_for_another_tokenizer(verifier, tmp_path) -> None:
    # Same tokenizer content, different fingerprint: the bundled table must not be trusted.
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text((verifier.path / "config.json").read_text())
    tok_json = json.loads((verifier.path / "tokenizer.json").read_text())
    (other / "tokenizer.json").write_text(json.dumps(tok_json, indent=1))
    ids = R.english_top_token_ids(other, 300)
    mt_ids = set(R.count_tokens(R.load_tokenizer(other), R.mtbench_en_turns()))
    assert set(ids) - {2} <= mt_ids


def test_token_coverage_on_real_text(verifier, shared_data) -> None:
    en_ids = R.english_top_token_ids(verifier.path, 8192)
    def turns(lang: str) -> list[str]:
        rows = (shared_data / "eval" / "mtbench" / f"{lang}.jsonl").read_text().splitlines()
        return [json.loads(r)["turns"][0] for r in rows]
    en = R.token_coverage(verifier.path, turns("en"), en_ids)
    fr = R.token_coverage(verifier.path, turns("fr"), en_ids)
    ru = R.token_coverage(verifier.path, turns("ru"), en_ids)
    assert en > 0.8
    assert ru < fr < en
    assert R.token_coverage(R.load_tokenizer(verifier.path), ["hello"], []) == 0.0
    with pytest.raises(R.VocabRefError):
        R.token_coverage(verifier.path, [""], en_ids)
