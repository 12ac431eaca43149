"""Script rules (core/langid_script.py) and how core/langid.py uses them."""

from __future__ import annotations

import time

import pytest

from polyspec.core import langid, langid_script
from polyspec.core.langid import LangGuess, allowed_labels, detect, detect_cleaned, detect_cleaned_fasttext

# Real text in each script a rule owns: greetings and everyday questions.
OWNED = {
    "ko": "안녕하세요, 오늘 날씨가 어때요?",
    "ja": "今日はいい天気ですね。散歩に行きませんか？",
    "th": "สวัสดีครับ วันนี้อากาศดีไหม",
    "el": "Καλημέρα, τι κάνεις σήμερα;",
    "he": "שלום, מה שלומך היום?",
    "ka": "გამარჯობა, როგორ ხარ?",
    "hy": "Բարև, ինչպե՞ս ես այսօր:",
}
SHORT_OWNED = {"ko": "감사합니다", "ja": "次の指示", "th": "ขอบคุณ", "el": "Ευχαριστώ πολύ", "he": "תודה רבה",
               "ka": "მადლობა", "hy": "Շնորհակալություն"}


@pytest.fixture
def fasttext_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Texts fastText is asked about (the rules exist so that it is not)."""
    seen: list[str] = []
    real = langid._fasttext

    def spy(cleaned: str, allowed: langid.LabelSet | None, k: int):  # type: ignore[no-untyped-def]
        seen.append(cleaned)
        return real(cleaned, allowed, k)

    monkeypatch.setattr(langid, "_fasttext", spy)
    return seen


@pytest.mark.parametrize("lang", sorted(OWNED))
def test_each_rule_decides_real_text_without_a_model(lang: str, fasttext_calls: list[str]) -> None:
    for text in (OWNED[lang], SHORT_OWNED[lang]):
        guess = detect(text)
        assert guess.language == lang, text
        assert guess.confidence >= 0.9
        assert detect(text, restrict=["en", lang]).language == lang
    assert fasttext_calls == []


def test_short_kana_fragments_are_japanese_where_both_models_said_chinese() -> None:
    assert detect_cleaned_fasttext("次の指示").language == "zh"  # the old path, kept as the baseline
    assert detect("次の指示") == LangGuess("ja", 1.0)


def test_a_long_chinese_sentence_quoting_kana_stays_chinese() -> None:
    text = "我想知道日语里的“ありがとう”在不同场合下应该怎么使用，以及它和中文的谢谢有什么区别"
    assert langid_script.script_language(text) is None  # kana is too small a share of a long text
    assert detect(text).language == "zh"


def test_han_without_kana_is_left_to_the_models_among_han_languages() -> None:
    assert langid_script.script_language("你好，请帮我写一封信") is None
    assert detect("你好，请帮我写一封信").language == "zh"
    out = langid_script.ruled_out("“伦敦警察")
    assert "en" in out and "fr" in out and "zh" not in out and "ja" not in out and "yue" not in out
    assert detect("“伦敦警察").language in {"zh", "ja"}


@pytest.mark.parametrize("text,lang", [
    ("What does 안녕하세요 mean in English?", "en"),  # Hangul is not most of the letters: the models decide
    ("Translate שלום into French, please.", "en"),
    ("Wie sagt man Καλημέρα auf Deutsch?", "de"),
    ("Что значит слово 今日は по-японски?", "ru"),
])
def test_mixed_script_text_goes_by_its_dominant_script(text: str, lang: str) -> None:
    assert langid_script.script_language(text) is None
    assert detect(text).language == lang


def test_a_text_mostly_in_an_owned_script_keeps_the_rule_despite_latin_words() -> None:
    text = "파이썬에서 list와 tuple의 차이점을 설명해 주세요"
    guess = langid_script.script_language(text)
    assert guess is not None and guess.language == "ko" and 0.5 < guess.confidence < 1.0


def test_cyrillic_letters_rule_out_languages_whose_alphabet_lacks_them() -> None:
    assert {"ru", "bg", "sr", "mk"} <= langid_script.ruled_out("Дякую, їжак").codes
    assert "uk" not in langid_script.ruled_out("Дякую, їжак") and "be" in langid_script.ruled_out("Дякую, їжак")
    ru = langid_script.ruled_out("Объясните это")  # ъ, э
    assert "uk" in ru and "sr" in ru and "ru" not in ru and "bg" in ru
    assert not langid_script.ruled_out("Привет мир").codes & {"ru", "uk", "bg"}  # letters they all share
    assert not langid_script.ruled_out("Bonne nuit") and not langid_script.ruled_out("éàü")
    # A strong vote, not a hard rule: the word pair goes to the language its letters allow.
    assert detect("Гарного дня і ночі").language == "uk"
    assert detect("Всё хорошо, спасибо").language == "ru"


@pytest.mark.parametrize("text", ["", " ", "\t\n  ", "🙂🙂🙂", "🚀 🔥 👍", "123 456", "…", "\u200b\u200b"])
def test_empty_whitespace_and_symbol_only_text(text: str) -> None:
    assert langid_script.script_language(text) is None
    guess = detect(text)
    assert 0.0 <= guess.confidence <= 1.0
    restricted = detect(text, restrict=["fr", "de"])
    assert restricted.language in {"fr", "de", "und"} and 0.0 <= restricted.confidence <= 1.0


@pytest.mark.parametrize("text", [
    "안녕하세요 " * 7000,  # 42 kB in one owned script
    "日本語のテキスト" * 5000,
    "Дякую їжак " * 4000,
    "a" * 40_000,
    "🙂" * 40_000,
    ("Bonjour " + "Ω" * 3) * 4000,
])
def test_40_kb_inputs_cost_a_bounded_time(text: str) -> None:
    assert len(text) >= 40_000
    detect(text)  # models loaded outside the timing
    start = time.perf_counter()
    for _ in range(20):
        detect(text)
        langid_script.script_language(text)
        langid_script.ruled_out(text[:langid.SHORT_CHARS])
    # Each reads a bounded head: well under a millisecond each on an idle core; 50 ms each is a loaded machine.
    assert (time.perf_counter() - start) / 20 < 0.05


def test_restricted_detection_only_returns_allowed_labels() -> None:
    texts = [*OWNED.values(), *SHORT_OWNED.values(), "次の指示", "“伦敦警察", "Гарного дня і ночі", "Bonne nuit",
             "What does 안녕하세요 mean?", "🙂", "", "ok"]
    for restrict in (["fr", "de"], ["ru", "en"], ["zh"], ["ko", "ja"], ["th", "el", "he", "ka", "hy"]):
        labels = allowed_labels(restrict)
        for text in texts:
            guess = detect(text, restrict=restrict)
            assert guess.language in restrict or (guess.language == "und" and not text.strip()), (text, restrict)
            assert 0.0 <= guess.confidence <= 1.0
            if text:
                assert detect_cleaned(text, labels).language in restrict


def test_a_rule_for_a_language_not_served_falls_back_to_the_models() -> None:
    """Korean text when only French and English are served: the models choose among them, unsure."""
    guess = detect(OWNED["ko"], restrict=["fr", "en"])
    assert guess.language in {"fr", "en"} and guess.confidence < 0.5
