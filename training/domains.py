"""Domain of an unlabeled prompt, from cheap surface cues.

Only used when a record carries no ``domain`` field. Code is the domain that matters most for a draft
(its token distribution differs sharply from prose), so it gets the most cues; math gets a few;
everything else is "general".
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"```")
_CODE_LINE = re.compile(
    r"^\s*(def |class |import |from \S+ import |#include|function |public |private |fn |let |const |var |"
    r"return\b|for \(|while \(|if \(|SELECT |CREATE TABLE)",
    re.MULTILINE,
)
_SYMBOL_LINE = re.compile(r"[;{}]\s*$", re.MULTILINE)
_CALL = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\([^()\n]*\)")
_MATH = re.compile(r"(\d+\s*[-+*/×÷^=]\s*\d+|\\frac|\\sqrt|\$[^$\n]+\$|\b(solve|equation|integral|derivative)\b)")


def code_score(text: str) -> int:
    """How many independent code cues the text shows (0 = none)."""
    score = 0
    if _FENCE.search(text):
        score += 2
    score += min(2, len(_CODE_LINE.findall(text)))
    if len(_SYMBOL_LINE.findall(text)) >= 2:
        score += 1
    if len(_CALL.findall(text)) >= 2 and ("=" in text or "return" in text):
        score += 1
    return score


def detect_domain(text: str) -> str:
    """'code', 'math' or 'general'. Two code cues are needed so one stray 'return' or brace does not count."""
    if code_score(text) >= 2:
        return "code"
    if len(_MATH.findall(text)) >= 1 and sum(ch.isdigit() for ch in text) >= 2:
        return "math"
    return "general"
