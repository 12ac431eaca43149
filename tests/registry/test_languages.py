"""add-language: codes, prompt formats, scripts, which draft covers a language (the shipped ones on the bundled
samples, measured or predicted acceptance), plans; bad input writes nothing."""

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
    fr = reg.add_language("fra", shared_data / "train" / "fr.jsonl", verifier_rec.name, shipped=False)
    assert (fr.language, fr.script, fr.is_latin, fr.plan) == ("fr", "Latin", True, "finetune")
    assert fr.coverage_reference == "en-top8192" and 0.5 < fr.coverage < 1.0 and "reference" in fr.reason
    assert (fr.draft, fr.acceptance, fr.fits, fr.num_prompts) == (None, None, [], 3663)
    again = reg.add_language("fr", shared_data / "train" / "fr.jsonl", verifier_rec.name, shipped=False)
    assert len(reg.languages()) == 1 and again.coverage == pytest.approx(fr.coverage)


def test_plans_against_an_active_draft(reg, base_draft, shared_data: Path) -> None:
    profiles = {lang: reg.add_language(lang, shared_data / "train" / f"{lang}.jsonl", base_draft.verifier,
                                       shipped=False) for lang in ("fr", *NON_LATIN)}
    assert profiles["fr"].plan == "finetune"
    for lang, script in NON_LATIN.items():
        p = profiles[lang]
        assert (p.script, p.is_latin, p.plan) == (script, False, "from-scratch-custom-vocab"), lang
        assert p.coverage < profiles["fr"].coverage
    assert {p.coverage_reference for p in profiles.values()} == {p.draft for p in profiles.values()} == {base_draft.ref}
    assert all(0.0 < p.coverage < 1.0 for p in profiles.values())
    # en-base@1 has no evaluation: no acceptance to go by, said so
    assert {(p.acceptance, p.acceptance_basis) for p in profiles.values()} == {(None, "none")}
    assert "no acceptance figure" in profiles["fr"].reason and "fine-tune en-base@1" in profiles["fr"].reason


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
              verifier_rec.name, "--no-shipped", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert {"language", "script", "is_latin", "coverage", "plan", "reason", "coverage_reference", "draft",
            "acceptance", "acceptance_basis", "fits"} <= set(out)
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
                verifier_rec.name, "--no-shipped")
    assert human.exit_code == 0 and "plan: finetune" in human.stdout


def test_cli_portuguese_names_the_multilingual_draft(cli, registry_url: str) -> None:
    """A fresh registry, no --prompts: the shipped drafts are weighed on the bundled Portuguese sample. The
    multilingual draft is made for pt and was measured on its held-out prompts; it covers it best."""
    from polyspec.registry import open_registry

    res = cli("add-language", "pt", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["script"], out["is_latin"], out["text"], out["prompts_file"]) == ("Latin", True, "bundled sample", None)
    assert out["draft"] == "smollm2-135m-instruct-multi" and out["plan"] == "extend-multilingual"
    assert out["acceptance_basis"] == "measured" and 2.5 < out["acceptance"] < 3.5
    fits = {f["draft"]: f for f in out["fits"]}
    assert fits["smollm2-135m-instruct-en"]["acceptance"] < out["acceptance"]  # the specialists carry over less
    assert out["coverage"] == pytest.approx(fits[out["draft"]]["coverage"], abs=1e-4)
    assert out["coverage"] > fits["smollm2-135m-instruct-en"]["coverage"]
    human = cli("add-language", "pt")
    assert human.exit_code == 0, human.stderr
    assert "covered best by: smollm2-135m-instruct-multi (measured mean acceptance length" in human.stdout
    assert "plan: extend-multilingual" in human.stdout
    with open_registry(registry_url) as reg:
        assert [(p.language, p.draft) for p in reg.languages()] == [("pt", "smollm2-135m-instruct-multi")]
    listed = cli("languages")
    assert listed.exit_code == 0 and f"{out['acceptance']:.2f} measured" in listed.stdout


def test_cli_measured_acceptance_and_scripts_no_draft_covers(cli, tmp_path: Path) -> None:
    ja = json.loads(cli("add-language", "ja", "--json").stdout)
    assert (ja["draft"], ja["acceptance_basis"], ja["is_latin"]) == ("smollm2-135m-instruct-multi", "measured", False)
    assert ja["acceptance"] == pytest.approx(3.56, abs=0.01)  # its MT-Bench-160 figure in the manifest
    assert ja["plan"] == "extend-multilingual"
    # scripts of languages in no training set (every bundled sample's script has a draft made for it)
    texts = {"bn": "আমি প্রতিদিন সকালে বাজারে যাই এবং তাজা সবজি কিনি। আজ আকাশ পরিষ্কার, তাই আমরা নদীর ধারে হাঁটব।",
             "ta": "நான் தினமும் காலையில் சந்தைக்குச் சென்று காய்கறிகள் வாங்குகிறேன். இன்று வானம் தெளிவாக உள்ளது."}
    for lang, script in (("bn", "Bengali"), ("ta", "Tamil")):
        sample = tmp_path / f"{lang}.jsonl"
        sample.write_text(json.dumps({"prompt": texts[lang]}, ensure_ascii=False) + "\n", encoding="utf-8")
        out = json.loads(cli("add-language", lang, "--prompts", str(sample), "--json").stdout)
        assert (out["script"], out["is_latin"], out["plan"]) == (script, False, "from-scratch-custom-vocab"), lang
        assert not any(f["covers_script"] for f in out["fits"]) and "no draft is made for" in out["reason"]
        assert out["acceptance_basis"] == "predicted-unseen-script" and out["acceptance"] < 1.8
        assert f"{script} script (not Latin)" in out["reason"]


def test_cli_hostile_input_is_refused_and_writes_nothing(cli, reg, tmp_path: Path) -> None:
    before = snapshot(reg)
    for args, code, words in [
        (("xq",), 2, "unknown language code 'xq'"),
        (("sw",), 3, "no bundled text sample for 'sw'"),  # a real language: give its prompts
        (("fr", "--threshold", "1.5"), 2, "--threshold must lie between 0 and 1"),
        (("fr", "--threshold", "-0.1"), 2, "--threshold must lie between 0 and 1"),
        (("fr", "--prompts", str(tmp_path / "nope.jsonl")), 3, "not found"),
        (("",), 2, "unknown language code"),
        (("../../etc",), 2, "unknown language code"),
    ]:
        res = cli("add-language", *args)
        assert res.exit_code == code and words in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
    assert snapshot(reg) == before


def test_cli_a_language_without_sample_uses_its_prompts(cli, tmp_path: Path) -> None:
    sw = tmp_path / "sw.txt"
    sw.write_text("Habari ya asubuhi, rafiki yangu.\nUnaweza kunisaidia kuandika barua pepe?\n", encoding="utf-8")
    out = json.loads(cli("add-language", "swa", "--prompts", str(sw), "--json").stdout)
    assert (out["language"], out["text"], out["num_prompts"], out["script"]) == ("sw", "prompts", 2, "Latin")
    assert out["draft"] is not None and out["plan"] in ("extend-multilingual", "finetune")
