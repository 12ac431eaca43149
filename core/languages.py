"""Language codes: ISO 639-1/-3 (and 639-2/B) normalisation, so ``fra``, ``FR`` and ``fre`` are all ``fr``.

One answer everywhere: the registry's language profiles, training's target language, the router's pins
and evaluation records all go through :func:`resolve_language`. pycountry's tables are read once.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import lru_cache

from polyspec.core.errors import InvalidInput

MULTILINGUAL = "mul"  # ISO 639-2 "multiple languages": domain drafts that serve every language
UNDETERMINED = "und"  # ISO 639-2 "undetermined": language ID was not sure
_SPECIAL = {MULTILINGUAL: "Multiple languages", UNDETERMINED: "Undetermined"}


class UnknownLanguage(InvalidInput):
    """A language code that is neither ISO 639-1 nor ISO 639-3. ``suggestions`` holds close codes."""

    def __init__(self, message: str, suggestions: list[str] | None = None) -> None:
        super().__init__(message)
        self.suggestions = suggestions or []

    def details(self) -> dict[str, object]:
        return {"suggestions": self.suggestions}


@dataclass(frozen=True)
class Language:
    code: str  # ISO 639-1 when one exists, else 639-3
    name: str


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[str, Language], dict[str, str]]:
    """code (639-1, 639-3, 639-2/B) -> Language, and spelling keys (codes, lower-case names) -> label."""
    import pycountry

    by_code: dict[str, Language] = {}
    by_key: dict[str, str] = {}
    for lang in pycountry.languages:
        best = getattr(lang, "alpha_2", None) or lang.alpha_3
        record = Language(code=best, name=lang.name)
        for code in (best, lang.alpha_3, getattr(lang, "bibliographic", None)):
            if code:
                by_code.setdefault(code, record)
        for key in (best, lang.alpha_3, lang.name.lower()):
            by_key.setdefault(key, f"{best} ({lang.name})")
    for code, name in _SPECIAL.items():
        by_code[code] = Language(code, name)
    return by_code, by_key


def resolve_language(code: str) -> Language:
    """Normalise an ISO 639-1/639-3 (or 639-2/B) code; an unknown one raises with close matches."""
    if not isinstance(code, str):
        raise UnknownLanguage(f"a language code must be a string, not {type(code).__name__}")
    raw = code.strip().lower()
    found = _tables()[0].get(raw) if 2 <= len(raw) <= 3 else None
    if found is None:
        suggestions = suggest_languages(raw[:64])
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        shown = code if len(code) <= 40 else code[:40] + "…"
        raise UnknownLanguage(f"unknown language code {shown!r} (expected ISO 639-1 or 639-3){hint}", suggestions)
    return found


def normalize_language(code: str) -> str:
    """``"FRA"`` -> ``"fr"``; raises :class:`UnknownLanguage`."""
    return resolve_language(code).code


def lookup_language(code: str) -> str | None:
    """The normalised code of an ISO 639 code or a BCP 47 tag (``"FRA"``, ``"pt-BR"``, ``"en_US"`` -> ``"fr"``,
    ``"pt"``, ``"en"``), or None. A dictionary lookup and nothing else: the router calls it on client pins,
    where `resolve_language`'s suggestions (a fuzzy scan of every language name) would be a cost a client
    could multiply at will."""
    if not isinstance(code, str) or len(code) > 35:  # 35: the longest BCP 47 tag a client may send
        return None
    base = code.strip().replace("_", "-").split("-", 1)[0].lower()
    found = _tables()[0].get(base) if 2 <= len(base) <= 3 else None
    return found.code if found is not None else None


def is_language(code: str) -> bool:
    try:
        resolve_language(code)
    except UnknownLanguage:
        return False
    return True


def suggest_languages(raw: str, n: int = 5) -> list[str]:
    """Close codes, by code spelling and by language name ("french" -> "fr (French)")."""
    by_key = _tables()[1]
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
            norm = normalize_language(item)
            if norm not in out:
                out.append(norm)
    return out
