"""The math cues of core.domains, split for speed, match exactly what the one case-insensitive alternation
they replace matched."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from polyspec.core import domains
from polyspec.core.text import head_and_tail

# The pattern core.domains used before the split, kept here as the reference.
REFERENCE = re.compile(
    r"\d[ \t]*[-+*/×÷^=][ \t]*\d|\\frac|\\sqrt|\$[^$\n]{1,200}\$|"
    r"\b(?:solve|equation|integral|derivative|probability|theorem)\b",
    re.IGNORECASE,
)

# Case-insensitive matches that str.lower() alone would miss or get wrong, and look-alikes that must not match.
CASES = [
    "SOLVE for x", "Solve", "an EQUATION", "ſolve this", "Dıerivative", "İNTEGRAL", "ıntegral", "the \u212aelvin",
    "İntegral calculus", "prob\u0130ability", "dissolve the salt", "theorems", "equations", "re-solve",
    "x = 1 + 2", "1+2", "1 × 2", "3÷4", "2^10", "a $x^2$ b", "$$", "$\n$", "\\frac{1}{2}", "\\sqrt2",
    "Löse die Gleichung", "Résoudre l'équation", "solve_it", "_solve", "solve\u0301", "ΘΕΏΡΗΜΑ theorem",
    "", "42", "no cue at all", "THEOREM", "theORem", "PROBABILITY\u0130",
]


def _pack_prompts(root) -> list[str]:
    texts = []
    paths = sorted((root / "train").glob("*.jsonl")) + sorted((root / "train" / "more").glob("*.jsonl.gz"))
    for path in paths:  # read line by line: str.splitlines() would also cut at U+2028 inside a prompt
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["prompt"] for line in f if line.strip()]
    return texts


@pytest.mark.parametrize("text", CASES)
def test_math_cue_matches_the_reference_on_hard_cases(text: str) -> None:
    assert domains._math_cue(text) == (REFERENCE.search(text) is not None)


def test_math_cue_and_domains_match_the_reference_on_the_prompt_pack(shared_data) -> None:
    texts = _pack_prompts(shared_data)
    assert len(texts) > 50_000  # the pack's 13 + 18 languages
    cues = 0
    for text in texts:
        window = head_and_tail(text)
        expected = REFERENCE.search(window) is not None
        assert domains._math_cue(window) == expected, text[:200]
        cues += expected
    assert cues > 1000  # the comparison saw both answers often
