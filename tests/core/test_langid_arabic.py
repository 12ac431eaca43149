"""Arabic-script letters as a prior (core/langid_arabic.py), the likely labels of a short text
(`LangGuess.likely`), and hostile inputs to both."""

from __future__ import annotations

import time

import pytest

from polyspec.core import langid, langid_arabic, langid_script
from polyspec.core.langid import LIKELY_MAX, LangGuess, detect, detect_cleaned

# Two-word openings of requests, in everyday wording. The data pack has no Urdu or Persian prompts, so these
# are written for the test; bench/langid.py measures Persian on real text (gettext catalogs).
URDU = ["براہ کرم", "مجھے بتائیں", "ایک کہانی", "آپ کیسے", "پاکستان کی", "لکھیں ایک", "اردو میں", "یہ کیا", "میں نے"]
PERSIAN = ["لطفا یک", "چگونه می", "من می‌خواهم", "یک داستان", "به من"]
ARABIC = ["اكتب قصة", "ما هي", "هل يمكنك", "اشرح لي", "كيف يمكن"]


@pytest.mark.parametrize(("text", "expected"), [
    ("ایک کہانی", langid_arabic.NOT_ARABIC_OR_PERSIAN),  # ہ: Urdu only
    ("میں نے", langid_arabic.NOT_ARABIC_OR_PERSIAN),  # ں ے
    ("یک داستان", langid_arabic.NOT_ARABIC),  # ی ک, no Arabic-only letter
    ("اكتب قصة", langid_arabic.NOT_PERSIAN_OR_URDU),  # ك ة
    ("ما", frozenset()),  # letters all three write
    ("یك", frozenset()),  # Persian ye beside Arabic kaf: an Arabic-keyboard Persian text, nothing ruled out
    ("", frozenset()),
    ("hello", frozenset()),
    ("Привет мир", frozenset()),
    ("🙂🙂 !!", frozenset()),
])
def test_letters_rule_out_the_languages_that_never_write_them(text: str, expected: frozenset[str]) -> None:
    assert langid_arabic.ruled_out(text) == expected


@pytest.mark.parametrize(("lang", "text"), [*[("ur", t) for t in URDU], *[("fa", t) for t in PERSIAN],
                                            *[("ar", t) for t in ARABIC]])
def test_short_arabic_script_texts_get_their_language(lang: str, text: str) -> None:
    assert detect(text).language == lang  # all labels: Urdu went to Persian before the letters counted
    assert detect(text, restrict=["ar", "fa", "ur", "en"]).language == lang


def test_the_vote_weighs_down_what_the_letters_rule_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The letters reach the short-text vote as ruled-out languages (weighed by `RULED_OUT_WEIGHT`)."""
    seen: list[tuple[str, bool, bool, bool]] = []
    real = langid._vote

    def spy(cleaned, votes, allowed, out):  # type: ignore[no-untyped-def]
        seen.append((cleaned, "ar" in out, "fa" in out, "ur" in out))
        return real(cleaned, votes, allowed, out)

    monkeypatch.setattr(langid, "_vote", spy)
    for text in ("ایک کہانی", "یک داستان", "اكتب قصة"):
        detect(text)
    assert seen == [("ایک کہانی", True, True, False), ("یک داستان", True, False, False), ("اكتب قصة", False, True, True)]
    assert langid._weighed([(0.8, "__label__ar"), (0.2, "__label__fa")], langid_script.RuledOut(frozenset({"ar"})),
                           None) == pytest.approx({"ar": 0.8 * langid.RULED_OUT_WEIGHT, "fa": 0.2})


def test_a_short_texts_likely_labels_lead_with_its_language() -> None:
    guess = detect("Completa la", restrict=["en", "es", "it", "fr"])  # Italian and Spanish both write it
    assert guess.likely[0] == guess.language and set(guess.likely) == {"es", "it"}
    assert guess.labels == guess.likely
    for text in ("Una persona", "Programa", "Com un", "ok"):
        g = detect(text)
        assert g.likely[0] == g.language and 1 <= len(g.likely) <= LIKELY_MAX
        assert len(set(g.likely)) == len(g.likely)


def test_one_label_paths_have_no_alternatives_and_likely_is_not_compared() -> None:
    script = detect("감사합니다")  # the script rule
    long = detect("Bonjour, pourriez-vous m'expliquer comment fonctionne la photosynthèse ?")
    assert script.likely == () and script.labels == ("ko",)
    assert long.likely == () and long.labels == ("fr",)
    assert LangGuess("fr", 0.5, ("fr", "it")) == LangGuess("fr", 0.5)


@pytest.mark.parametrize("text", ["", " ", "!!! ??? ...", "🙂🙂🙂", "🙂 ایک", "ایک 🙂 hello мир 你好", "ـــ", "\u200c\u200c",
                                  "٣٤٥ ١٢", "ایک" * 5, "a" * 3])
def test_hostile_short_inputs_give_a_valid_guess(text: str) -> None:
    guess = detect(text)
    assert isinstance(guess.language, str) and 0.0 <= guess.confidence <= 1.0
    assert guess.labels and guess.labels[0] == guess.language


def test_huge_arabic_script_texts_cost_a_bounded_amount() -> None:
    small, huge = "ایک کہانی " * 5, "ایک کہانی " * 200_000  # 2 MB
    detect(small), detect(huge)  # models loaded
    start = time.perf_counter()
    langid_arabic.ruled_out(huge)
    assert time.perf_counter() - start < 0.01  # the head only
    start = time.perf_counter()
    assert detect(huge).language == "ur"
    assert time.perf_counter() - start < 0.5  # cleaning reads the head and tail, fastText 256 characters


def test_the_prior_reaches_the_vote_only_on_short_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = langid_arabic.ruled_out
    monkeypatch.setattr(langid_arabic, "ruled_out", lambda text: seen.append(text) or real(text))
    detect_cleaned("ایک کہانی")
    detect_cleaned("یہ ایک بہت لمبی کہانی ہے جو ایک چھوٹے سے گاؤں کے بارے میں ہے")
    assert seen == ["ایک کہانی"]
    assert langid.SHORT_CHARS > len("ایک کہانی")
