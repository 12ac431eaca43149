"""Stage 1: prompt formats, language/domain filtering, de-duplication, held-out split, bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.conftest import pack_rows, write_jsonl
from training.config import PromptsConfig, ReplaySpec
from training.domains import detect_domain
from training.errors import EmptyPromptFile, NoPromptsForLanguage, PromptsError
from training.prompts import build_prompts, dedup_key, read_jsonl, read_prompt_file


def test_reads_the_three_formats(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        '{"id": "a", "prompt": "Bonjour, comment vas-tu ?", "lang": "fr", "domain": "general"}\n'
        '{"prompt": "  Quelle est la capitale de la France ?  "}\n'
        '\n'
        '{"messages": [{"role": "user", "content": "Écris un poème."}, {"role": "assistant", "content": "..."}]}\n',
        encoding="utf-8",
    )
    recs = read_prompt_file(path)
    assert [r["messages"][-1]["content"] for r in recs] == [
        "Bonjour, comment vas-tu ?", "Quelle est la capitale de la France ?", "Écris un poème."]
    assert recs[0]["id"] == "a" and recs[0]["domain"] == "general"
    assert recs[2]["messages"] == [{"role": "user", "content": "Écris un poème."}]  # the old answer is dropped


@pytest.mark.parametrize("content, error, needle", [
    ("", EmptyPromptFile, "holds no prompts"),
    ("\n\n", EmptyPromptFile, "holds no prompts"),
    ('{"prompt": "ok"}\n{not json}\n', PromptsError, ":2: not valid JSON"),
    ('{"text": "no prompt field"}\n', PromptsError, "expected a non-empty 'prompt'"),
    ('{"messages": [{"role": "assistant", "content": "hi"}]}\n', PromptsError, "must end with a non-empty user turn"),
])
def test_bad_files_give_clear_errors(tmp_path: Path, content: str, error: type, needle: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(error, match=None) as info:
        read_prompt_file(path)
    assert needle in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PromptsError, match="not found"):
        read_prompt_file(tmp_path / "nope.jsonl")


def test_wrong_language_file_names_the_languages_found(en_prompts: Path, tmp_path: Path) -> None:
    with pytest.raises(NoPromptsForLanguage) as info:
        build_prompts(tmp_path, "fr", PromptsConfig(files=[en_prompts]), seed=0)
    assert "no 'fr' prompts" in str(info.value) and "en (30)" in str(info.value)


def test_filters_language_dedupes_and_splits(shared_data: Path, tmp_path: Path) -> None:
    fr = pack_rows(shared_data, "fr", "general", 30)
    en = pack_rows(shared_data, "en", "general", 10)
    dupes = [dict(r, id=r["id"] + "-dup", prompt=r["prompt"].upper() + " !!") for r in fr[:5]]
    src = write_jsonl(tmp_path / "in.jsonl", fr + en + dupes)
    stats = build_prompts(tmp_path / "out", "fr", PromptsConfig(files=[src], heldout_fraction=0.2), seed=7)
    train = read_jsonl(tmp_path / "out" / "train.jsonl")
    held = read_jsonl(tmp_path / "out" / "heldout.jsonl")
    assert stats["duplicates"] == 5 and stats["languages_found"]["en"] == 10
    assert len(held) == 6 and len(train) == 24
    assert {r["lang"] for r in train + held} == {"fr"}
    assert not {dedup_key(r["text"]) for r in train} & {dedup_key(r["text"]) for r in held}
    again = build_prompts(tmp_path / "again", "fr", PromptsConfig(files=[src], heldout_fraction=0.2), seed=7)
    assert again == stats
    assert read_jsonl(tmp_path / "again" / "heldout.jsonl") == held  # the split is seeded


def test_domain_filter_uses_labels_and_detection(shared_data: Path, tmp_path: Path) -> None:
    labelled = pack_rows(shared_data, "de", "code", 6) + pack_rows(shared_data, "de", "general", 6)
    unlabelled = [{"prompt": r["prompt"]} for r in pack_rows(shared_data, "de", "code", 12)[6:]] + [
        {"prompt": r["prompt"]} for r in pack_rows(shared_data, "de", "math", 4)]
    src = write_jsonl(tmp_path / "de.jsonl", labelled + unlabelled)
    build_prompts(tmp_path / "out", "de", PromptsConfig(files=[src], domain="code", heldout_fraction=0.0,
                                                        min_heldout=0), seed=0)
    kept = read_jsonl(tmp_path / "out" / "train.jsonl")
    assert len(kept) == 12 and all(r["domain"] == "code" for r in kept)
    assert sum(1 for r in kept if r.get("domain_detected")) == 6
    with pytest.raises(NoPromptsForLanguage, match="domain 'medical'"):
        build_prompts(tmp_path / "none", "de", PromptsConfig(files=[src], domain="medical"), seed=0)


@pytest.mark.parametrize("text, domain", [
    ("```python\ndef add(a, b):\n    return a + b\n```", "code"),
    ("Fix this:\nint main() {\n  printf(\"hi\");\n  return 0;\n}", "code"),
    ("class Stack:\n    def push(self, x):\n        self.items.append(x)", "code"),
    ("Wie viel ist 12 * 7 + 3?", "math"),
    ("Schreibe ein Gedicht über den Herbst; es soll fröhlich sein.", "general"),
    ("Return the book to the library, please.", "general"),
])
def test_detect_domain(text: str, domain: str) -> None:
    assert detect_domain(text) == domain


def test_replay_mixes_other_language_prompts(fr_prompts: Path, en_prompts: Path, tmp_path: Path) -> None:
    cfg = PromptsConfig(files=[fr_prompts], replay=[ReplaySpec.parse(f"{en_prompts}:0.5")], heldout_fraction=0.25)
    stats = build_prompts(tmp_path, "fr", cfg, seed=0)
    rows = read_jsonl(tmp_path / "train.jsonl")
    replay = [r for r in rows if r.get("replay")]
    assert stats["train"] == 36 and len(replay) == 18 and {r["lang"] for r in replay} == {"en"}
    assert all(r["lang"] == "fr" for r in read_jsonl(tmp_path / "heldout.jsonl"))
    assert ReplaySpec.parse("/a/b.jsonl") == ReplaySpec(path=Path("/a/b.jsonl"), ratio=1.0)
    assert json.loads(ReplaySpec.parse("x.jsonl:2").model_dump_json())["ratio"] == 2.0


def test_multilingual_domain_run_keeps_every_language(shared_data: Path, tmp_path: Path) -> None:
    """language "mul" (ISO 639-2: multiple languages) makes a domain draft from all languages' prompts."""
    rows = pack_rows(shared_data, "de", "code", 4) + pack_rows(shared_data, "fr", "code", 4) + pack_rows(
        shared_data, "fr", "math", 3)
    src = write_jsonl(tmp_path / "mixed.jsonl", rows)
    stats = build_prompts(tmp_path / "out", "mul", PromptsConfig(files=[src], domain="code", heldout_fraction=0.0,
                                                                 min_heldout=0), seed=0)
    kept = read_jsonl(tmp_path / "out" / "train.jsonl")
    assert len(kept) == 8 and {r["lang"] for r in kept} == {"de", "fr"} and stats["kept"] == 8
