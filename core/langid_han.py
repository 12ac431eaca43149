"""Han characters' view of short texts, for `core.langid`'s vote: Japanese or Chinese.

A kanji-only Japanese fragment ("規律違反", "聖徳太子") and a Chinese one look alike to fastText and lingua, and
the word frequencies do not score either language (no spaces between words). But the two write many
characters differently: Japanese shinjitai against simplified Chinese (規/规, 違/违, 聖/圣, 続/续, 気/气), and
characters one language uses far more often (Japanese 込 and 働, Chinese 们 and 这). This module scores a
text by each Han character's log-odds ja:zh, counted on the data pack's training prompts
(`core.langid_han_table`, about 3,000 characters, 11 KB, built by scripts/langid_han_table.py; never the
evaluation set), naive-Bayes style: the sum over the text's Han characters, as a probability.

Bounded cost: at most `MAX_CHARS` Han characters are read, each a dict lookup.
"""

from __future__ import annotations

import math
import re

from polyspec.core.langid_han_table import BUCKETS, STEP
from polyspec.core.langid_script import _HAN

MAX_CHARS = 32  # a short text has fewer; a longer one is fastText's alone
_NEGLIGIBLE = 1e-3  # as the other voters': below this a probability hardly moves a vote
_HAN_RE = re.compile(f"[{_HAN}]")
_ODDS: dict[str, float] = {char: step * STEP for step, chars in BUCKETS.items() for char in chars}
LANGUAGES = frozenset({"ja", "zh"})


def probabilities(text: str, candidates: frozenset[str]) -> dict[str, float]:
    """How likely Japanese and Chinese are by ``text``'s Han characters (they sum to 1; a negligible one left
    out); empty when ``candidates`` lacks one of the two or no Han character of the text is in the table."""
    if text.isascii() or not LANGUAGES <= candidates:
        return {}
    total, seen = 0.0, False
    for char in _HAN_RE.findall(text[: 4 * MAX_CHARS])[:MAX_CHARS]:
        odds = _ODDS.get(char)
        if odds is not None:
            total += odds
            seen = True
    if not seen:
        return {}
    ja = 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, total))))
    return {lang: p for lang, p in (("ja", ja), ("zh", 1.0 - ja)) if p >= _NEGLIGIBLE}
