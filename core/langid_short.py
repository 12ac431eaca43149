"""lingua's view of short texts, for `core.langid` to combine with fastText's.

fastText reads a text as bags of character n-grams and is weak on a word or two (82 % right on two-word
prompts); lingua-language-detector (high-accuracy mode: 1- to 5-gram models per language, offline) sees such
texts differently, and the two err on different texts. This module only answers "how likely is each
candidate language, by lingua": `core.langid` decides when to ask and how to weigh the answer.

Costs to know:
- A language's models take about 0.5 s to load and 15–20 MB of memory, with the GIL held. They load once per
  process, on first use, and every detector shares them. `preload` loads them ahead, off the request path.
- Without a restriction, the candidates are `COMMON` (29 languages): the first short text of a script loads
  all of that script's models (Latin: 18 of them, about 6 s and 400 MB). The router always restricts.
- A call costs about 0.1 ms with 9 candidates, 0.3 ms with all of `COMMON` (a fastText call: 0.02 ms). Its
  cost grows with the candidates (3 Latin-script ones cost half of 18 on a word pair) and with the length.
- `core.langid` asks only about the 4 leading languages of fastText's and the word frequencies' votes, on
  close calls: a detector per such set (built once, about 0.15 ms). Asking about fastText's top labels alone
  was 1-1.5 points worse on word pairs (the right language is often below fastText's top few); with the word
  frequencies' vote added, 0.2. Low-accuracy mode (trigrams only: 2-4 times faster on 10-20 characters) was
  3.5 points worse on word pairs.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from typing import Any

# Candidates for unrestricted detection: the 28 languages with the largest share of web content (W3Techs,
# 2024), Hindi (the most spoken language outside that list) and Urdu (Hindi's pair in Arabic script: without
# it, a short Urdu text had only Persian and Arabic to be told from, and went to Persian). A short text in another language is still
# named when fastText is sure of it, or by fastText's half of the vote. Why not all 75 lingua knows: on a
# word or two, rare languages win by chance (Esperanto, Tagalog, Sesotho took Spanish and Italian word
# pairs), and each Latin-script candidate costs time on every call. fastText's spelling of the codes.
COMMON = frozenset("ar cs da de el en es fa fi fr he hi hu id it ja ko nl pl pt ro ru sk sv th tr uk ur vi zh".split())
_TO_LINGUA = {"no": "nb"}  # fastText label -> lingua ISO 639-1 code, where they differ
_FROM_LINGUA = {v: k for k, v in _TO_LINGUA.items()}
_NEGLIGIBLE = 1e-3  # below this, a confidence hardly moves a vote (half of it counts)
# One detector per candidate set: `core.langid` asks about the few leading languages of each short text, so
# sets vary; a detector costs about 0.15 ms to build once the models are loaded, and little memory.
_MAX_DETECTORS = 1024

_lock = threading.Lock()
_detectors: dict[frozenset[str], tuple[Any, dict[Any, str]]] = {}
_known: frozenset[str] | None = None


def known() -> frozenset[str]:
    """The languages lingua knows, in fastText's spelling."""
    global _known
    if _known is None:
        from lingua import Language

        _known = frozenset(_FROM_LINGUA.get(c, c) for c in (lang.iso_code_639_1.name.lower() for lang in Language.all()))
    return _known


def candidates(codes: Iterable[str] | None) -> frozenset[str]:
    """The languages lingua chooses among: ``codes`` it knows, or `COMMON` when there is no restriction."""
    if codes is None:
        return COMMON
    return _known_of(codes if isinstance(codes, frozenset) else frozenset(codes))


@functools.lru_cache(maxsize=64)  # one entry per restriction: a router has one per routing table
def _known_of(codes: frozenset[str]) -> frozenset[str]:
    return codes & known()


def _detector(langs: frozenset[str], preload: bool = False) -> tuple[Any, dict[Any, str]]:
    """A lingua detector for ``langs`` (at least two) and its Language -> code map; built once per set (again
    with ``preload``, which loads its models now). Built under the lock, so two threads never build (and load
    models for) the same set at once."""
    found = _detectors.get(langs)
    if found is not None and not preload:
        return found
    with _lock:
        found = None if preload else _detectors.get(langs)
        if found is None:
            from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

            by_code = {code: Language.from_iso_code_639_1(getattr(IsoCode639_1, _TO_LINGUA.get(code, code).upper()))
                       for code in sorted(langs)}
            builder = LanguageDetectorBuilder.from_languages(*by_code.values())
            if preload:
                builder = builder.with_preloaded_language_models()
            if len(_detectors) >= _MAX_DETECTORS:
                _detectors.clear()  # models stay loaded (lingua shares them): rebuilding a detector is cheap
            found = _detectors[langs] = (builder.build(), {lang: code for code, lang in by_code.items()})
    return found


def confidences(text: str, langs: frozenset[str]) -> dict[str, float]:
    """lingua's confidence for each of ``langs`` it gives more than a negligible chance (they sum to about 1),
    keyed by fastText's spelling; empty when lingua cannot tell, or when fewer than two candidates leave it
    nothing to choose."""
    if len(langs) < 2:
        return {}
    detector, codes = _detector(langs)
    out = {}
    for c in detector.compute_language_confidence_values(text):  # most confident first
        if c.value < _NEGLIGIBLE:
            break  # the rest are smaller still: converting them costs more than they could change
        out[codes[c.language]] = c.value
    return out


def preload(langs: frozenset[str]) -> None:
    """Load the models of ``langs`` now (about 0.5 s each, the first time), so no request waits for them."""
    if len(langs) >= 2:
        _detector(langs, preload=True)
