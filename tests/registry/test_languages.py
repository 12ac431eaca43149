"""add-language: codes, prompt formats, scripts, coverage against real drafts, plans; bad input writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyspec.registry import PromptsError, UnknownLanguage
from polyspec.registry.languages import dominant_script, read_prompts, resolve_language
from tests.registry.conftest import snapshot

NON_LATIN = {"ja": "Japanese", "ru": "Cyrillic", "hi": "Devanagari", "th": "Thai", "ar": "Arabic"}


def test_language_codes_normalise_to_639_1() -> None:
    assert [resolve_language(c).code for c in ("fr", "FRA", "fre", "jpn", "haw")] == ["fr", "fr", "fr", "ja", "haw"]
    with pytest.raises(UnknownLanguage) as err:
        resolve_language("frnch")
    assert "fr (French)" in err.value.suggestions and "did you mean" in str(err.value)


def test_prompt_formats(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "un"}, {"turns": ["deux", "trois"]},
        {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "quatre"}]}]) + "\n")
    assert read_prompts(f) == ["un", "deux", "trois", "quatre"]
    plain = tmp_path / "p.txt"
    plain.write_text("bonjour\n\n  salut  \n")
    assert read_prompts(plain) == ["bonjour", "salut"]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(PromptsError, match=":2:"):
        read_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(PromptsError, match="no prompts"):
        read_prompts(tmp_path / "empty.txt")


@pytest.mark.parametrize(("text", "script"), [
    ("Привет, как дела?", "Cyrillic"), ("今日は良い天気ですね。", "Japanese"), ("今天天气很好。", "Han"),
    ("안녕하세요", "Hangul"), ("नमस्ते दुनिया", "Devanagari"), ("مرحبا بالعالم", "Arabic"),
    ("สวัสดีครับ", "Thai"), ("Γειά σου κόσμε", "Greek"), ("שלום עולם", "Hebrew"), ("Ça va très bien", "Latin"),
])
def test_dominant_script(text: str, script: str) -> None:
    assert dominant_script([text, "ok 123"]).script == script


def test_without_a_draft_coverage_uses_the_english_reference(reg, verifier_rec, shared_data: Path) -> None:
    fr = reg.add_language("fra", shared_data / "train" / "fr.jsonl", verifier_rec.name)
    assert (fr.language, fr.script, fr.is_latin, fr.plan) == ("fr", "Latin", True, "finetune")
    assert fr.coverage_reference == "en-top8192" and 0.5 < fr.coverage < 1.0 and "reference" in fr.reason
    again = reg.add_language("fr", shared_data / "train" / "fr.jsonl", verifier_rec.name)
    assert len(reg.languages()) == 1 and again.coverage == pytest.approx(fr.coverage)


def test_plans_against_an_active_draft(reg, base_draft, shared_data: Path) -> None:
    profiles = {lang: reg.add_language(lang, shared_data / "train" / f"{lang}.jsonl", base_draft.verifier)
                for lang in ("fr", *NON_LATIN)}
    assert profiles["fr"].plan == "finetune"
    for lang, script in NON_LATIN.items():
        p = profiles[lang]
        assert (p.script, p.is_latin, p.plan) == (script, False, "from-scratch-custom-vocab"), lang
        assert p.coverage < profiles["fr"].coverage
    assert {p.coverage_reference for p in profiles.values()} == {base_draft.ref}
    assert all(0.0 < p.coverage < 1.0 for p in profiles.values())


def test_bad_language_input_leaves_the_registry_unchanged(reg, verifier_rec, shared_data: Path, tmp_path: Path) -> None:
    before = snapshot(reg)
    with pytest.raises(UnknownLanguage):
        reg.add_language("xq", shared_data / "train" / "fr.jsonl", verifier_rec.name)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(PromptsError):
        reg.add_language("fr", empty, verifier_rec.name)
    with pytest.raises(PromptsError, match="not found"):
        reg.add_language("fr", tmp_path / "nope.jsonl", verifier_rec.name)
    assert snapshot(reg) == before


def test_cli_add_language(cli, verifier_rec, shared_data: Path, tmp_path: Path) -> None:
    res = cli("add-language", "ru", "--prompts", str(shared_data / "train" / "ru.jsonl"), "--verifier",
              verifier_rec.name, "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert {"language", "script", "is_latin", "coverage", "plan", "reason", "coverage_reference"} <= set(out)
    assert (out["language"], out["script"], out["is_latin"], out["plan"]) == (
        "ru", "Cyrillic", False, "from-scratch-custom-vocab")
    listed = json.loads(cli("languages", "--json").stdout)
    assert [p["language"] for p in listed] == ["ru"]
    unknown = cli("add-language", "frnch", "--prompts", str(shared_data / "train" / "fr.jsonl"), "--json")
    assert unknown.exit_code == 2 and "fr (French)" in json.loads(unknown.stdout)["suggestions"]
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    res = cli("add-language", "fr", "--prompts", str(empty), "--verifier", verifier_rec.name)
    assert res.exit_code == 2 and "no prompts" in res.stderr and "Traceback" not in res.stderr
    human = cli("add-language", "fr", "--prompts", str(shared_data / "train" / "fr.jsonl"), "--verifier",
                verifier_rec.name)
    assert human.exit_code == 0 and "plan: finetune" in human.stdout
