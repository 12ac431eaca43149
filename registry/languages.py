"""Scripts of a language's prompts: the pure half of ``add-language`` (no database, no models).

Language codes live in :mod:`polyspec.core.languages` and prompt files in :mod:`polyspec.core.prompts`."""

from __future__ import annotations

import unicodedata
from collections import Counter
from dataclasses import dataclass

from polyspec.core.languages import Language, normalize_languages, resolve_language, suggest_languages
from polyspec.core.prompts import PromptsError, read_prompts

__all__ = ["Language", "ScriptCount", "char_script", "dominant_script", "normalize_languages", "read_prompts",
           "resolve_language", "suggest_languages"]

# Words that open a Unicode character name without naming its script ("FULLWIDTH LATIN ...").
_NAME_PREFIXES = {"FULLWIDTH", "HALFWIDTH", "MATHEMATICAL", "CIRCLED", "PARENTHESIZED", "SMALL", "MODIFIER",
                  "SQUARED", "NEGATIVE", "OLD", "COMBINING"}
_SCRIPT_ALIASES = {"CJK": "Han", "HIRAGANA": "Kana", "KATAKANA": "Kana", "KATAKANA-HIRAGANA": "Kana"}
# Kana share: above this fraction of Han+Kana letters the text is Japanese (kanji mixed with kana).
JAPANESE_KANA_SHARE = 0.10


@dataclass(frozen=True)
class ScriptCount:
    script: str  # "Latin", "Cyrillic", "Han", "Japanese", "Hangul", "Devanagari", ...
    share: float  # fraction of counted letters in that script
    letters: int  # letters counted in all scripts

    @property
    def is_latin(self) -> bool:
        return self.script == "Latin"


def char_script(ch: str) -> str | None:
    """The script of one letter from its Unicode name ("CYRILLIC SMALL LETTER A" -> "Cyrillic")."""
    if not ch.isalpha():
        return None
    words = unicodedata.name(ch, "").split()
    while words and words[0] in _NAME_PREFIXES:
        words = words[1:]
    if not words or words[0] in ("LETTER", "SIGN"):
        return None
    return _SCRIPT_ALIASES.get(words[0], words[0].title())


def dominant_script(texts: list[str]) -> ScriptCount:
    """The script most letters are written in. Han mixed with enough kana counts as Japanese."""
    counts: Counter[str] = Counter()
    for text in texts:
        for ch in text:
            script = char_script(ch)
            if script is not None:
                counts[script] += 1
    han, kana = counts.get("Han", 0), counts.get("Kana", 0)
    if kana and kana >= JAPANESE_KANA_SHARE * (han + kana):
        counts["Japanese"] = counts.pop("Han", 0) + counts.pop("Kana")
    total = sum(counts.values())
    if total == 0:
        raise PromptsError("the prompts contain no letters, so their script cannot be determined")
    script, n = counts.most_common(1)[0]
    return ScriptCount(script=script, share=n / total, letters=total)
