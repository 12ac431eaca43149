"""Word frequencies' view of short texts, for `core.langid` to combine with fastText's and lingua's.

On a word or two, knowing which words a language uses says more than character n-grams: "Jedoch", "Huruvida",
"Помилка" or "riproduci" each belong to one language's vocabulary. This module scores a text by how often
each candidate language uses its words, from wordfreq's "small" word lists (wordfreq 3.1, pinned: Apache-2.0
code, word lists CC BY-SA 4.0, built from Wikipedia, subtitles, news, books, web text and Reddit), the
`TOP_WORDS` most frequent words of each. A word no candidate lists (a name, a number, a typo) weighs nothing.

Costs to know:
- Tables are built per language on first use, from wordfreq's files: 0.1-0.2 s each, with the GIL held.
  `preload` builds them ahead, off the request path. Without a restriction, the candidates are
  `langid_short.COMMON` less the languages written without spaces (zh, ja: wordfreq would need a word
  segmenter; ko and th are settled by script rules first).
- In memory each language keeps two arrays (word hashes and frequencies: 9 bytes a word, under 0.3 MB), and
  each candidate set one merged table: about 7 MB for the 25 common languages, a few MB for a router's.
- A call costs about 5-10 µs: a hash, a binary search and a slice per word, then one softmax over the candidates.
"""

from __future__ import annotations

import functools
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterable

import numpy as np
import regex
import wordfreq

# Each language's this many most frequent words. On the tuning texts, word pairs were 0.3 points better with
# 30,000 than with 10,000 and 0.1 worse than with whole lists (60,000 words for some languages): past this,
# the words are mostly names, which tell little, and the tables grow.
TOP_WORDS = 30_000
# The frequency of a word missing from a language's list, in centibels (-700 cB: once in 10 million words),
# a little below the rarest listed words. -800 was as good on the tuning texts; the value matters little
# because a word missing from every candidate's list adds the same to each.
ABSENT_CB = -700
_STEP_CB = 4  # frequencies are kept in steps of 4 cB (10 % apart), so one byte holds one
_ABSENT = -ABSENT_CB // _STEP_CB
_NEGLIGIBLE = 1e-3  # as langid_short's: below this a probability hardly moves a vote
_ODDS = [10.0 ** (-i * _STEP_CB / 100) for i in range(100)]  # odds of a score i steps behind the best (past 100: 0)
_NO_SPACES = frozenset({"zh", "ja", "ko", "th"})  # their words are not space-separated: not scored here
_TO_WORDFREQ = {"no": "nb", "tl": "fil"}  # fastText label -> wordfreq code, where they differ
# A word: letters and combining marks (Devanagari vowel signs are marks), with inner apostrophes (l'homme).
_WORD = regex.compile(r"[\p{L}\p{M}]+(?:['’][\p{L}\p{M}]+)*")

_lock = threading.Lock()
Table = tuple[array, bytes, tuple[str, ...]]  # word hashes (sorted), frequency steps row by row, languages
_tables: dict[frozenset[str], Table] = {}
_MAX_TABLES = 16  # one per candidate set; a router has one per routing table


@functools.cache
def known() -> frozenset[str]:
    """The languages scored here, in fastText's spelling."""
    from_wf = {v: k for k, v in _TO_WORDFREQ.items()}
    return frozenset(from_wf.get(c, c) for c in wordfreq.available_languages("small")) - _NO_SPACES


@functools.lru_cache(maxsize=64)
def _words(code: str) -> tuple[np.ndarray, np.ndarray]:
    """One language's table: its `TOP_WORDS` words' hashes (sorted) and frequencies (in `_STEP_CB` steps)."""
    hashes: dict[int, int] = {}
    # cBpack: bucket i holds the words of frequency -i cB, most frequent first.
    for i, bucket in enumerate(wordfreq.read_cBpack(wordfreq.available_languages("small")[_TO_WORDFREQ.get(code, code)])):
        for word in bucket:
            hashes.setdefault(hash(word), i // _STEP_CB)  # a str hash: stable within the process that built it
        if len(hashes) >= TOP_WORDS:
            break
    keys = np.fromiter(hashes.keys(), dtype=np.int64, count=len(hashes))
    steps = np.fromiter(hashes.values(), dtype=np.uint8, count=len(hashes))
    order = np.argsort(keys)
    return keys[order], steps[order]


def _table(langs: frozenset[str]) -> Table:
    """One table for a candidate set: every word of their lists (hashes, sorted), a row of frequency steps
    per word (one byte per language, `_ABSENT` where a language does not list it), the languages. Plain
    ``array`` and ``bytes``: a text has a few words, and numpy's per-call overhead would cost more than
    the lookups (a binary search and a slice per word)."""
    found = _tables.get(langs)
    if found is not None:
        return found
    with _lock:
        found = _tables.get(langs)
        if found is None:
            order = tuple(sorted(langs))
            per = [_words(code) for code in order]
            keys = np.unique(np.concatenate([k for k, _ in per]))
            rows = np.full((len(keys), len(order)), _ABSENT, dtype=np.uint8)
            for column, (k, steps) in enumerate(per):
                rows[np.searchsorted(keys, k), column] = steps
            if len(_tables) >= _MAX_TABLES:
                _tables.clear()
            found = _tables[langs] = (array("q", keys.tobytes()), rows.tobytes(), order)
    return found


def candidates(codes: Iterable[str]) -> frozenset[str]:
    """The languages of ``codes`` scored here."""
    return _known_of(codes if isinstance(codes, frozenset) else frozenset(codes))


@functools.lru_cache(maxsize=64)  # one entry per candidate set: a router has one per routing table
def _known_of(codes: frozenset[str]) -> frozenset[str]:
    return codes & known()


def probabilities(text: str, langs: frozenset[str]) -> dict[str, float]:
    """How likely each of ``langs`` is by its words' frequencies (they sum to 1; negligible ones left out),
    keyed by fastText's spelling; empty when no candidate lists any word of ``text`` (names, numbers, another
    script), or when fewer than two candidates leave nothing to choose."""
    if len(langs) < 2:
        return {}
    words = _WORD.findall(text.casefold())
    if not words:
        return {}
    keys, rows, order = _table(langs)
    n, width = len(keys), len(order)
    total: list[int] | None = None
    for word in words:
        h = hash(word)
        at = bisect_left(keys, h)
        if at < n and keys[at] == h:
            row = rows[at * width : (at + 1) * width]
            total = list(row) if total is None else [a + b for a, b in zip(total, row, strict=True)]
    if total is None:
        return {}
    # Scores are sums of -log10 frequency in steps; the smallest sum is the most likely language.
    low = min(total)
    odds = [_ODDS[t - low] if t - low < len(_ODDS) else 0.0 for t in total]
    whole = sum(odds)
    return {order[j]: p / whole for j, p in enumerate(odds) if p >= _NEGLIGIBLE * whole}


def preload(langs: frozenset[str]) -> None:
    """Build the table of ``langs`` now (0.1-0.2 s a language the first time), so no request waits for it."""
    if len(langs) >= 2:
        _table(langs)
