from __future__ import annotations

import subprocess
import sys

import pytest

from polyspec.core.langid import LangGuess, clean_for_langid, detect, detect_many

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
    import json

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
