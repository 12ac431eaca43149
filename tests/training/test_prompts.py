"""Stage 1: prompt formats, language/domain filtering, de-duplication, held-out split, bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.conftest import pack_rows, write_jsonl
from polyspec.training.config import PromptsConfig, ReplaySpec
from polyspec.core.prompts import PromptsError
from polyspec.training.errors import EmptyPromptFile, NoPromptsForLanguage
from polyspec.training.prompts import build_prompts, dedup_key, read_jsonl, read_prompt_file


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
    ('{"answer": "no prompt field"}\n', PromptsError, "no 'prompt', 'turns', 'text' or 'messages' field"),
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


def test_training_reads_every_file_add_language_reads(tmp_path: Path) -> None:
    """The bug this guards: `registry add-language X --prompts F` accepted `turns`/`text`/plain-line files
    that `train` then refused. Both now go through polyspec.core.prompts."""
    from polyspec.registry.languages import read_prompts

    files = {
        "turns.jsonl": '{"turns": ["Quelle heure est-il ?", "Et demain ?"]}\n',
        "text.jsonl": '{"text": "Écris un poème sur la mer."}\n',
        "plain.txt": "Bonjour tout le monde.\nComment vas-tu ?\n",
    }
    for name, content in files.items():
        path = tmp_path / name
        path.write_text(content, encoding="utf-8")
        texts = read_prompts(path)  # what add-language profiles
        recs = read_prompt_file(path)  # what training's first stage reads
        assert texts and recs and all(r["messages"][-1]["role"] == "user" for r in recs)
        assert {t for r in recs for t in r["text"].split("\n\n")} == set(texts)
