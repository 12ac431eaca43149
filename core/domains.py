"""The one domain detector: ``code``, ``math`` or ``general``, from cheap surface cues.

Training labels prompts that carry no ``domain`` field with it, and the router classifies requests with
it, so a math draft that training makes is a math draft the router can pick.

Cost is bounded and linear: only the first and last ``core.text.WINDOW`` characters are read, and no pattern can
backtrack across lines (horizontal whitespace only: ``[ \\t]``, never ``\\s*`` before ``$``), so a body of
40,000 newlines costs what a short prompt costs.
"""

from __future__ import annotations

import re
from typing import Any

from polyspec.core.text import head_and_tail

DOMAINS = ("general", "code", "math")

_FENCE = "```"
# (substrings one of which any match contains, pattern). The substring scan runs at C speed and lets
# most prose skip the regex; it never changes a result.
_CODE_SIGNALS: list[tuple[tuple[str, ...], Any]] = [
    (("def", "class"), re.compile(r"^[ \t]*(?:def|class)[ \t]+\w+[^\n]*:[ \t]*$", re.MULTILINE)),
    (("import", "from"),
     re.compile(r"^[ \t]*(?:import|from)[ \t]+[\w.]+(?:[ \t]+import[ \t]+\w+)?[ \t]*$", re.MULTILINE)),
    (("#include",), re.compile(r"^[ \t]*#include[ \t]*[<\"]", re.MULTILINE)),
    (("function", "const", "let", "var"), re.compile(r"\b(?:function|const|let|var)[ \t]+\w+[ \t]*[=(]")),
    (("public",), re.compile(r"\bpublic[ \t]+(?:static[ \t]+)?(?:void|int|class|String)\b")),
    ((";", "{", "}"), re.compile(r"[;{}][ \t]*$", re.MULTILINE)),
    (("return",), re.compile(r"\breturn\b[^\n]*$", re.MULTILINE)),
    (("printf", "println", "console.log", "System.out"),
     re.compile(r"\b(?:printf|println|console\.log|System\.out)[ \t]*\(")),
    (("=>", "==", "!=", "+=", "->", "::"), re.compile(r"=>|==|!=|\+=|->|::")),
    (("SELECT", "INSERT", "UPDATE", "DELETE"), re.compile(r"\b(?:SELECT|INSERT|UPDATE|DELETE)\b")),
]
_LINE_SIGNALS = ("def", "import")
_SQL_TAIL = re.compile(r"\b(?:FROM|INTO|SET|WHERE)\b")
# The math cues. One alternation of them all, case-insensitive, cost 20 us on a usual prompt (no prefix lets
# the regex engine skip ahead, so every alternative is tried at every position); apart, with the words
# looked up in the lower-cased text, they cost a third of that and match exactly the same texts
# (`_math_words`; tests/core/test_domains.py compares the two on the prompt pack).
_MATH_LATEX = ("\\frac", "\\sqrt")
_MATH_DOLLARS = re.compile(r"\$[^$\n]{1,200}\$")
_MATH_OPERATION = re.compile(r"\d[ \t]*[-+*/×÷^=][ \t]*\d")
_MATH_WORDS = ("solve", "equation", "integral", "derivative", "probability", "theorem")
_MATH_WORD = re.compile(r"\b(?:solve|equation|integral|derivative|probability|theorem)\b")
_MATH_WORD_ANY_CASE = re.compile(_MATH_WORD.pattern, re.IGNORECASE)
# Characters that a case-insensitive pattern matches to an ASCII letter but str.lower() does not turn into
# one: dotted capital I (lower() makes it two characters), long s and dotless i (re's case fixes).
_CASE_SPECIAL = ("\u0130", "\u017f", "\u0131")


def code_signals(text: str) -> int:
    """How many distinct code cues the text shows (a fenced block counts 2)."""
    text = head_and_tail(text)
    hits = 2 if _FENCE in text else 0
    for needles, pattern in _CODE_SIGNALS:
        for needle in needles:  # a plain loop: a generator in any() costs more than the substring scans
            if needle in text:
                break
        else:
            continue
        if needles[0] in _LINE_SIGNALS:  # two definitions (or imports) are two cues, as in real code
            hits += min(2, sum(1 for _ in zip(range(2), pattern.finditer(text))))
            continue
        match = pattern.search(text)
        if match and (needles[0] != "SELECT" or _SQL_TAIL.search(text, match.end())):
            hits += 1
    return hits


def detect_domain(text: str) -> str:
    """'code', 'math' or 'general'. Two code cues are needed, so one stray 'return' or brace is prose."""
    text = head_and_tail(text)
    if code_signals(text) >= 2:
        return "code"
    if _math_cue(text) and sum(ch.isdigit() for ch in text) >= 2:
        return "math"
    return "general"


def _math_cue(text: str) -> bool:
    """Whether the text shows a math cue: LaTeX, a $...$ span, an operation between digits or a math word."""
    return (any(cue in text for cue in _MATH_LATEX) or _MATH_DOLLARS.search(text) is not None
            or _math_words(text) or _MATH_OPERATION.search(text) is not None)


def _math_words(text: str) -> bool:
    """``_MATH_WORD_ANY_CASE.search(text)``, exactly, at a fraction of its cost: on the lower-cased text a
    case-sensitive search needs no case folding, and is skipped when no word occurs at all. Lower-casing
    keeps every word boundary (letters stay letters), and only the characters of ``_CASE_SPECIAL`` match an
    ASCII letter case-insensitively without lower-casing to it: a text with one takes the slow path."""
    if any(ch in text for ch in _CASE_SPECIAL):
        return _MATH_WORD_ANY_CASE.search(text) is not None
    lowered = text.lower()
    for word in _MATH_WORDS:
        if word in lowered:
            return _MATH_WORD.search(lowered) is not None
    return False
