"""Which existing draft covers a language, and how well: the measured half of ``add-language``.

For every draft of the verifier (the registry's, and the shipped ones not registered yet) it gives the
share of the verifier's tokens on the language's text that the draft vocabulary holds (``coverage``) and its
mean acceptance length there:

- **measured** when the draft has an evaluation on the language (over all answers; on the benchmark most
  drafts share);
- **predicted** otherwise, from the draft's own measurements: take the measured language of the same script
  whose tokens are most like this language's (another language than the draft's own where there is one,
  since that is what a new language is to it), and scale its gain over 1 by the coverage ratio,
  ``1 + (L_ref - 1) * min(1, coverage / coverage_ref)``: a token outside the vocabulary is never accepted;
- **predicted from unseen scripts** when the draft was measured on no language of that script and is made
  for none: the median acceptance of every draft on languages of a script it was not trained on;
- none when it is made for the script but has no figure in it.

A draft *covers* the scripts of the languages it was made for (its ``languages``). Texts are the
bundled samples (registry/data, the same news sentences in every language) so that languages compare on the
same content. Pure functions over counts: the tokenizer and the weights are read by the caller.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from polyspec.models.coverage import coverage
from polyspec.models.shipped import common_benchmark, measured_acceptance

MEASURED, PREDICTED, UNSEEN_SCRIPT, UNKNOWN = "measured", "predicted", "predicted-unseen-script", "none"


@dataclass(frozen=True)
class Candidate:
    """A draft that might serve the language: its reference, what it was made for, its vocabulary and figures."""

    ref: str  # "name@version" in the registry, the shipped name otherwise
    languages: list[str]
    vocab: frozenset[int]
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # rows with language, benchmark, subset, MAL
    shipped: bool = False  # listed in models/drafts or pulled, not in the registry

    @property
    def multilingual(self) -> bool:
        return len(self.languages) > 1


@dataclass(frozen=True)
class Fit:
    """How one draft does on the language."""

    draft: str
    languages: list[str]
    multilingual: bool
    coverage: float
    acceptance: float | None
    basis: str  # measured | predicted | predicted-unseen-script | none
    covers_script: bool
    reference: str | None = None  # the measured language a prediction scales from
    shipped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"draft": self.draft, "languages": list(self.languages), "multilingual": self.multilingual,
                "coverage": round(self.coverage, 4),
                "acceptance": None if self.acceptance is None else round(self.acceptance, 3),
                "basis": self.basis, "covers_script": self.covers_script, "reference": self.reference,
                "shipped": self.shipped}


def similarity(a: Mapping[int, int], b: Mapping[int, int]) -> float:
    """Histogram intersection of two token distributions: 1.0 for the same shares, 0.0 for no token in common."""
    ta, tb = sum(a.values()), sum(b.values())
    if not ta or not tb:
        return 0.0
    return sum(min(n / ta, b.get(t, 0) / tb) for t, n in a.items())


def _measured_by_language(cand: Candidate, benchmarks: Mapping[str, str | None]) -> dict[str, float]:
    out: dict[str, float] = {}
    for lang in {e["language"] for e in cand.evaluations}:
        mal = measured_acceptance(cand.evaluations, lang, benchmarks.get(lang))
        if mal is None:
            mal = measured_acceptance(cand.evaluations, lang)
        if mal is not None:
            out[lang] = mal
    return out


def assess(language: str, counts: Counter[int], script: str, candidates: list[Candidate],
           reference_counts: Callable[[str], Counter[int] | None],
           script_of: Callable[[str], str | None]) -> list[Fit]:
    """Each candidate's coverage and measured or predicted acceptance on ``language``, best first.

    ``reference_counts(lang)`` / ``script_of(lang)``: token counts and script of another language's bundled
    sample (None when it has none); the candidates' measured languages are the references."""
    langs = {e["language"] for c in candidates for e in c.evaluations}
    benchmarks = {lang: common_benchmark((c.evaluations for c in candidates), lang) for lang in langs | {language}}
    measured = {c.ref: _measured_by_language(c, benchmarks) for c in candidates}
    unseen = [mal for c in candidates for lang, mal in measured[c.ref].items()
              if script_of(lang) is not None and script_of(lang) not in {script_of(x) for x in c.languages}]
    unseen_median = statistics.median(unseen) if unseen else None
    fits = []
    for cand in candidates:
        cov = coverage(counts, cand.vocab)
        covers = language in cand.languages or script in {script_of(x) for x in cand.languages}
        if language in measured[cand.ref]:
            fits.append(Fit(cand.ref, cand.languages, cand.multilingual, cov, measured[cand.ref][language],
                            MEASURED, covers, language, cand.shipped))
            continue
        refs = [x for x in measured[cand.ref] if script_of(x) == script and reference_counts(x) is not None]
        carried = [x for x in refs if x not in cand.languages]
        refs = carried or refs
        if refs:
            ref = max(refs, key=lambda x: (similarity(counts, reference_counts(x) or {}), x))
            ref_cov = coverage(reference_counts(ref) or Counter(), cand.vocab)
            ratio = min(1.0, cov / ref_cov) if ref_cov > 0 else 0.0
            mal: float | None = 1.0 + (measured[cand.ref][ref] - 1.0) * ratio
            fits.append(Fit(cand.ref, cand.languages, cand.multilingual, cov, mal, PREDICTED, covers, ref,
                            cand.shipped))
        else:  # no figure in this script: a script it never saw gets what other drafts did on one
            mal = None if covers else unseen_median
            fits.append(Fit(cand.ref, cand.languages, cand.multilingual, cov, mal,
                            UNKNOWN if mal is None else UNSEEN_SCRIPT, covers, None, cand.shipped))
    return sorted(fits, key=lambda f: (not f.covers_script, -(f.acceptance or 0.0), -f.coverage, f.draft))
