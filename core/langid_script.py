"""Script rules for language identification: what the letters of a text settle before any model reads it.

Two kinds, both cheap (a text of ASCII characters only, most prompts, costs one `str.isascii` call):

- `script_language`: the language of a text whose letters are mostly in a script that, among lid.176's
  labels, one language owns in practice. Such a text skips fastText and lingua: the rule is more accurate
  than the models on a word or two, and much faster.
- `ruled_out`: languages whose alphabet lacks a letter the text holds (Cyrillic: Ukrainian never writes
  ы э ё ъ, Russian never і ї є ґ, Serbian and Macedonian no й щ ь я ю). `core.langid` uses it as a strong
  vote against those languages on short texts, not as a verdict: a quoted foreign word can carry a letter.

Each rule has a cost, named where the rule is defined: the languages it can no longer return.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Only the head is read: the dominant script of a prompt shows in its first words, and the cost stays bounded
# whatever the length (the rules run on every non-ASCII text, long ones too).
SCAN_CHARS = 96

_HANGUL = "\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff"
# Hiragana, katakana (without U+30FB, the middle dot, which Chinese text borrows), phonetic extensions and
# half-width katakana.
_KANA = "\u3040-\u309f\u30a0-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"


@dataclass(frozen=True)
class _Rule:
    language: str
    chars: re.Pattern[str]  # one character of the script
    others: re.Pattern[str]  # one character not of it: counting these is cheaper where the script is most


def _rule(language: str, chars: str) -> _Rule:
    return _Rule(language, re.compile(f"[{chars}]"), re.compile(f"[^{chars}]"))


def _count(text: str, others: re.Pattern[str]) -> int:
    """How many characters of ``text`` are not ``others``: the complement is counted, because findall builds
    a string per match and the characters counted here are usually most of the text (letters; the script
    of a text that a rule is looked at for)."""
    return len(text) - len(others.findall(text))


# Where lid.176 has another label for the same script, the rule gives it up; the comment says which.
_RULES = (
    # Korean is the only language written in Hangul (lid.176 has no other).
    _rule("ko", _HANGUL),
    # Thai script: lid.176 has no other label for it (Lao, Khmer and Shan have scripts of their own); gives up
    # Northern Thai and Pali written in it, which lid.176 does not know either.
    _rule("th", "\u0e00-\u0e7f"),
    # Greek: gives up Pontic and Ancient Greek (not lid.176 labels) and Greek letters in formulas, which only
    # count where they are most of the letters.
    _rule("el", "\u0370-\u03ff\u1f00-\u1fff"),
    # Hebrew script: gives up Yiddish (lid.176's `yi`) and Ladino; Yiddish on the web is about a hundredth of
    # Hebrew.
    _rule("he", "\u0590-\u05ff\ufb1d-\ufb4f"),
    # Georgian script: gives up Mingrelian (lid.176's `xmf`) and Svan, which fastText mostly cannot tell from
    # Georgian on a few words anyway (it splits "გამარჯობა" 0.60 / 0.40 between them).
    _rule("ka", "\u10a0-\u10ff\u1c90-\u1cbf\u2d00-\u2d2f"),
    # Armenian script: lid.176 has no other label for it.
    _rule("hy", "\u0530-\u058f\ufb13-\ufb17"),
)
_OWNED = re.compile("[" + _HANGUL + _KANA + _HAN + "\u0e00-\u0e7f\u0370-\u03ff\u1f00-\u1fff\u0590-\u05ff\ufb1d-\ufb4f"
                    "\u10a0-\u10ff\u1c90-\u1cbf\u2d00-\u2d2f\u0530-\u058f\ufb13-\ufb17]")
_KANA_RE = re.compile(f"[{_KANA}]")
_NOT_CJK = re.compile(f"[^{_KANA}{_HAN}]")
_NOT_LETTER = re.compile(r"[\W\d_]")  # what is not a letter ([^\W\d_]: word characters but digits and _)
# Japanese prose carries kana in nearly every phrase (particles, verb endings), so kana among Han characters
# says Japanese. A Chinese sentence quoting a Japanese word ("日语里的“ありがとう”怎么用") has a little kana among
# much Han: on a text of `KANA_LONG` characters or more, kana must be at least `KANA_SHARE` of the Han and kana
# characters, or fastText decides (it reads that sentence as Chinese). On the tuning texts, 99 % of Japanese
# prompts had a kana share of 0.25 or more in their head (the lowest 0.13), Chinese ones none. A shorter text
# needs one kana in ten: "次の指示" is Japanese, which both models read as Chinese. What this gives up: a
# short Chinese fragment that quotes kana.
KANA_LONG = 24
KANA_SHARE = 0.2
KANA_SHARE_SHORT = 0.1
# Han characters and no kana decide nothing by rule: a kanji-only Japanese fragment (a compound noun,
# "内部統制") and a Chinese one look alike, and Cantonese (`yue`) and Wu (`wuu`), which lid.176 knows, are written
# in Han too. On the tuning texts, "Han without kana -> zh" on short texts cost Japanese word pairs 11 points
# for 6 gained on Chinese ones. Such a text only rules out the languages not written in Han (`ruled_out`).
HAN_LANGUAGES = frozenset({"zh", "ja", "yue", "wuu", "ko"})  # Korean: Hanja

# Cyrillic alphabets of the languages fastText confuses on short texts, lower case (the apostrophe that
# Ukrainian and Belarusian write for a hard sign is not a letter here). A letter outside a language's
# alphabet rules it out. Other Cyrillic languages (kk, ky, tt, mn, ...) are never ruled out; their own letters
# (ә, ү, ң, ...) rule out the six below.
_CYRILLIC_ALPHABETS = {
    "ru": "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
    "uk": "абвгґдеєжзиіїйклмнопрстуфхцчшщьюя",
    "be": "абвгдеёжзійклмнопрстуўфхцчшыьэюя",
    "bg": "абвгдежзийклмнопрстуфхцчшщъьюя",
    "sr": "абвгдђежзијклљмнњопрстћуфхцчџш",
    "mk": "абвгдѓежзѕијклљмнњопрстќуфхцчџш",
}
_CYRILLIC = re.compile("[\u0400-\u04ff]")


@dataclass(frozen=True)
class ScriptGuess:
    language: str
    confidence: float


def script_language(text: str) -> ScriptGuess | None:
    """The language the script of ``text``'s head settles, with the share of its letters in that script as
    confidence; None when no rule applies: no owned script, or one that is not most of the letters (an
    English question about "안녕" is for the models)."""
    if text.isascii():
        return None
    head = text[:SCAN_CHARS]
    first = _OWNED.search(head)
    if first is None:
        return None
    letters = max(1, _count(head, _NOT_LETTER))  # at least the owned character: marks are not letters
    for rule in _RULES:
        if rule.chars.match(first.group()):
            count = _count(head, rule.others)
            return ScriptGuess(rule.language, min(1.0, count / letters)) if 2 * count > letters else None
    cjk = _count(head, _NOT_CJK)
    if 2 * cjk <= letters:
        return None
    kana = len(_KANA_RE.findall(head))
    if kana and kana >= (KANA_SHARE if len(text) >= KANA_LONG else KANA_SHARE_SHORT) * cjk:
        return ScriptGuess("ja", min(1.0, cjk / letters))
    return None


@dataclass(frozen=True)
class RuledOut:
    """Languages a text's letters rule out: those in ``codes``, or, with ``all_but``, every other one."""

    codes: frozenset[str] = frozenset()
    all_but: frozenset[str] | None = None

    def __contains__(self, code: object) -> bool:
        return code in self.codes or (self.all_but is not None and code not in self.all_but)

    def __bool__(self) -> bool:
        return bool(self.codes) or self.all_but is not None


NOTHING = RuledOut()
_HAN_RE = re.compile(f"[{_HAN}]")


def ruled_out(text: str) -> RuledOut:
    """Languages that the letters of ``text`` rule out: where every letter is Han, those not written in Han;
    for Cyrillic, those of `_CYRILLIC_ALPHABETS` whose alphabet lacks one of its letters. Meant for short
    texts: it reads the whole text."""
    if text.isascii():
        return NOTHING
    if _CYRILLIC.search(text) is not None:
        found = set(_CYRILLIC.findall(text.lower()))
        return RuledOut(frozenset(lang for lang, alphabet in _CYRILLIC_ALPHABETS.items() if not found.issubset(alphabet)))
    letters = _count(text, _NOT_LETTER)
    if letters and len(_HAN_RE.findall(text)) == letters:
        return RuledOut(all_but=HAN_LANGUAGES)
    return NOTHING
