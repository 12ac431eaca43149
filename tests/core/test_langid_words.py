"""core.langid_words: word frequencies' vote on short texts (wordfreq's lists)."""

from __future__ import annotations

import pytest
import wordfreq

from polyspec.core import langid_short, langid_words
from polyspec.core.langid import detect

COMMON = langid_words.candidates(langid_short.COMMON)


@pytest.mark.parametrize(("text", "lang"), [
    ("Jedoch begab", "de"), ("Huruvida assistenten", "sv"), ("Помилка: не", "uk"), ("Buongiorno ragazzi", "it"),
    ("Vul de", "nl"), ("archivované položky", "cs"), ("मुझे बताओ", "hi"), ("l'homme qui", "fr"),
])
def test_a_languages_own_words_make_it_the_likeliest(text: str, lang: str) -> None:
    probs = langid_words.probabilities(text, COMMON)
    assert max(probs, key=probs.__getitem__) == lang, probs
    assert sum(probs.values()) == pytest.approx(1.0, abs=0.03)  # negligible ones are left out
    assert all(0.0 < p <= 1.0 for p in probs.values())


def test_unlisted_words_abstain() -> None:
    """Names, numbers, other scripts and empty text tell nothing: no vote at all, not a uniform one."""
    for text in ["Xqzvbn Plasco-Flaxman", "2004 (1967)", "据传这一", "", "   ", "!!! ???"]:
        assert langid_words.probabilities(text, COMMON) == {}, text


def test_fewer_than_two_candidates_leave_nothing_to_choose() -> None:
    assert langid_words.probabilities("bonjour", frozenset({"fr"})) == {}
    assert langid_words.probabilities("bonjour", frozenset()) == {}


def test_frequencies_follow_wordfreq() -> None:
    """The odds between two languages are their frequency ratio, to the table's 4 cB steps (10 %)."""
    word, langs = "casa", frozenset({"es", "it"})
    probs = langid_words.probabilities(word, langs)
    ratio = wordfreq.word_frequency(word, "es", "small") / wordfreq.word_frequency(word, "it", "small")
    assert probs["es"] / probs["it"] == pytest.approx(ratio, rel=0.25)


def test_candidates_are_languages_with_spaces_between_words() -> None:
    assert {"en", "fr", "ru", "ar", "hi", "no"} <= langid_words.known()
    assert not {"zh", "ja", "ko", "th"} & langid_words.known()
    assert langid_words.candidates(["fr", "zh", "xx"]) == {"fr"}
    # a candidate set with its table built for it answers only about its own languages
    assert set(langid_words.probabilities("bonjour merci", frozenset({"fr", "de", "zh"}))) <= {"fr", "de"}


def test_hostile_text_costs_one_pass() -> None:
    """A long text is one regex pass and one vectorised lookup: it answers, with probabilities still summing to 1."""
    text = "bonjour " * 100_000 + "\x00\u200b" * 1000 + "ﷺ" * 1000
    probs = langid_words.probabilities(text, COMMON)
    assert max(probs, key=probs.__getitem__) == "fr"
    assert langid_words.probabilities("\ud800 lone surrogate ok", COMMON)  # unpaired surrogates do not raise


def test_the_words_vote_fixes_what_fasttext_and_lingua_got_wrong() -> None:
    """Before the words voted, these went to en, de and ru (held-out cuts of the data pack)."""
    assert detect("Jedoch begab").language == "de"
    assert detect("Ditt lösenord").language == "sv"
    assert detect("не вдалося").language == "uk"
