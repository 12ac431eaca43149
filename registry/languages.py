"""Language codes, prompt files and scripts: the pure half of ``add-language`` (no database, no models)."""

from __future__ import annotations

import difflib
import json
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from registry.errors import PromptsError, UnknownLanguage

# Words that open a Unicode character name without naming its script ("FULLWIDTH LATIN ...").
_NAME_PREFIXES = {"FULLWIDTH", "HALFWIDTH", "MATHEMATICAL", "CIRCLED", "PARENTHESIZED", "SMALL", "MODIFIER",
                  "SQUARED", "NEGATIVE", "OLD", "COMBINING"}
_SCRIPT_ALIASES = {"CJK": "Han", "HIRAGANA": "Kana", "KATAKANA": "Kana", "KATAKANA-HIRAGANA": "Kana"}
# Kana share: above this fraction of Han+Kana letters the text is Japanese (kanji mixed with kana).
JAPANESE_KANA_SHARE = 0.10


@dataclass(frozen=True)
class Language:
    code: str  # ISO 639-1 when one exists, else 639-3
    name: str


@dataclass(frozen=True)
class ScriptCount:
    script: str  # "Latin", "Cyrillic", "Han", "Japanese", "Hangul", "Devanagari", ...
    share: float  # fraction of counted letters in that script
    letters: int  # letters counted in all scripts

    @property
    def is_latin(self) -> bool:
        return self.script == "Latin"


def resolve_language(code: str) -> Language:
    """Normalise an ISO 639-1/639-3 (or 639-2/B) code; unknown codes raise with close matches."""
    import pycountry

    raw = code.strip().lower()
    lang = None
    if len(raw) == 2:
        lang = pycountry.languages.get(alpha_2=raw)
    elif len(raw) == 3:
        lang = pycountry.languages.get(alpha_3=raw) or _by_bibliographic(raw)
    if lang is None:
        suggestions = suggest_languages(raw)
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        raise UnknownLanguage(f"unknown language code {code!r} (expected ISO 639-1 or 639-3){hint}", suggestions)
    return Language(code=getattr(lang, "alpha_2", None) or lang.alpha_3, name=lang.name)


def _by_bibliographic(raw: str):  # noqa: ANN202 (pycountry record)
    import pycountry

    for lang in pycountry.languages:
        if getattr(lang, "bibliographic", None) == raw:
            return lang
    return None


def suggest_languages(raw: str, n: int = 5) -> list[str]:
    """Close codes, by code spelling and by language name ("french" -> "fr")."""
    import pycountry

    by_key: dict[str, str] = {}
    for lang in pycountry.languages:
        best = getattr(lang, "alpha_2", None) or lang.alpha_3
        for key in (best, lang.alpha_3, lang.name.lower()):
            by_key.setdefault(key, f"{best} ({lang.name})")
    keys = difflib.get_close_matches(raw.lower(), list(by_key), n=n * 2, cutoff=0.6)
    out: list[str] = []
    for key in keys:
        if by_key[key] not in out:
            out.append(by_key[key])
    return out[:n]


def normalize_languages(codes: list[str] | tuple[str, ...] | str) -> list[str]:
    """["FR", "fra", "en"] or "fr,en" -> ["fr", "en"] (order kept, duplicates dropped)."""
    items = codes.split(",") if isinstance(codes, str) else list(codes)
    out: list[str] = []
    for item in items:
        if item.strip():
            norm = resolve_language(item).code
            if norm not in out:
                out.append(norm)
    return out


def read_prompts(path: str | Path) -> list[str]:
    """Texts of a prompts file: JSONL ({"prompt"}, {"turns"}, {"messages"}, {"text"}) or one prompt per line."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise PromptsError(f"prompts file not found: {p}")
    try:
        lines = p.read_text(encoding="utf-8").split("\n")  # not splitlines(): JSON strings may hold U+2028
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptsError(f"cannot read prompts file {p}: {exc}") from exc
    lines = [ln for ln in lines if ln.strip()]
    if lines and _looks_like_json_object(lines[0]):
        texts = [t for i, ln in enumerate(lines, 1) for t in _texts_of_record(ln, p, i)]
    else:
        texts = [ln.strip() for ln in lines]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise PromptsError(f"no prompts in {p} (expected JSONL with prompt/turns/messages, or one prompt per line)")
    return texts


def _looks_like_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _texts_of_record(line: str, path: Path, lineno: int) -> list[str]:
    try:
        rec = json.loads(line)
    except ValueError as exc:
        raise PromptsError(f"{path}:{lineno}: not valid JSON ({exc.args[0]})") from exc
    if not isinstance(rec, dict):
        raise PromptsError(f"{path}:{lineno}: expected a JSON object")
    if isinstance(rec.get("prompt"), str):
        return [rec["prompt"]]
    if isinstance(rec.get("turns"), list):
        return [t for t in rec["turns"] if isinstance(t, str)]
    if isinstance(rec.get("messages"), list):
        return [m["content"] for m in rec["messages"]
                if isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") != "system"]
    if isinstance(rec.get("text"), str):
        return [rec["text"]]
    raise PromptsError(f"{path}:{lineno}: no 'prompt', 'turns', 'messages' or 'text' field")


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
