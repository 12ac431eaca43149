"""registry.covering: measured acceptance first, else a prediction scaled by coverage from the draft's own
figures on the most similar language of the same script, else the unseen-script median; best fit first."""

from __future__ import annotations

from collections import Counter

import pytest

from polyspec.registry.covering import MEASURED, PREDICTED, UNKNOWN, UNSEEN_SCRIPT, Candidate, assess, similarity

# Token ids 0-9 are "Latin", 10-19 "Thai". Reference languages: es and it (Latin), ja (Japanese, ids 20-29).
SAMPLES = {"es": Counter({0: 5, 1: 5}), "it": Counter({2: 5, 3: 5}), "en": Counter({0: 3, 4: 7}),
           "ja": Counter({20: 10})}
SCRIPTS = {"es": "Latin", "it": "Latin", "en": "Latin", "ja": "Japanese", "pt": "Latin", "th": "Thai"}


def _eval(lang: str, mal: float, bench: str = "mtbench-160", subset: str = "all") -> dict[str, object]:
    return {"language": lang, "benchmark": bench, "subset": subset, "mean_acceptance_length": mal}


def _assess(lang: str, counts: Counter[int], script: str, cands: list[Candidate]):
    return assess(lang, counts, script, cands, SAMPLES.get, SCRIPTS.get)


def test_similarity_is_the_shared_share_of_tokens() -> None:
    assert similarity(Counter({1: 2, 2: 2}), Counter({1: 1, 2: 1})) == pytest.approx(1.0)
    assert similarity(Counter({1: 1}), Counter({2: 1})) == 0.0
    assert similarity(Counter(), Counter({2: 1})) == 0.0


def test_prediction_scales_the_most_similar_same_script_language_by_coverage() -> None:
    pt = Counter({0: 4, 1: 4, 9: 2})  # most like es; id 9 is outside the vocabulary
    multi = Candidate("multi@1", ["es", "it", "ja"], frozenset({0, 1, 2, 3, 20}),
                      [_eval("es", 3.0), _eval("it", 3.4), _eval("ja", 3.2), _eval("es", 9.9, subset="non_degenerate")])
    [fit] = _assess("pt", pt, "Latin", [multi])
    assert (fit.basis, fit.reference, fit.covers_script, fit.multilingual) == (PREDICTED, "es", True, True)
    assert fit.coverage == pytest.approx(0.8)
    assert fit.acceptance == pytest.approx(1 + (3.0 - 1) * 0.8 / 1.0)  # es covered fully: ratio 0.8


def test_a_language_the_draft_was_not_made_for_prefers_carry_over_figures() -> None:
    en = Candidate("en@1", ["en"], frozenset({0, 1, 2, 3, 4}), [_eval("en", 2.5), _eval("es", 2.1), _eval("it", 2.0)])
    [fit] = _assess("pt", Counter({0: 5, 1: 5}), "Latin", [en])  # identical to es: es is the reference
    assert (fit.reference, fit.acceptance) == ("es", pytest.approx(2.1))
    only_own = Candidate("en@1", ["en"], frozenset({0, 1, 2, 3, 4}), [_eval("en", 2.5)])
    [fit] = _assess("pt", Counter({0: 5, 1: 5}), "Latin", [only_own])
    assert (fit.reference, fit.acceptance) == ("en", pytest.approx(2.5))


def test_measured_wins_and_unseen_scripts_get_the_median_of_other_drafts_on_scripts_they_never_saw() -> None:
    en = Candidate("en@1", ["en"], frozenset({0, 1, 4}), [_eval("en", 2.5), _eval("ja", 1.2), _eval("th", 1.1)])
    multi = Candidate("multi@1", ["es", "ja"], frozenset({0, 1, 20}), [_eval("es", 3.0), _eval("ja", 3.4)])
    fits = _assess("th", Counter({10: 9, 0: 1}), "Thai", [multi, en])
    by = {f.draft: f for f in fits}
    assert (by["en@1"].basis, by["en@1"].acceptance) == (MEASURED, 1.1)
    # en on ja (1.2) and on th (1.1) are the only figures on a script the draft was not made for
    assert (by["multi@1"].basis, by["multi@1"].acceptance) == (UNSEEN_SCRIPT, pytest.approx(1.15))
    assert not any(f.covers_script for f in fits)
    assert [f.draft for f in fits] == ["multi@1", "en@1"]  # 1.15 > 1.1: best first


def test_a_draft_that_covers_the_script_ranks_first_and_no_figures_means_no_acceptance() -> None:
    bare = Candidate("bare@1", ["es"], frozenset({0, 1}))
    other = Candidate("ja@1", ["ja"], frozenset({0, 1, 20}), [_eval("es", 1.9)])
    fits = _assess("pt", Counter({0: 1, 1: 1}), "Latin", [other, bare])
    assert [f.draft for f in fits] == ["bare@1", "ja@1"]
    assert (fits[0].basis, fits[0].acceptance) == (UNKNOWN, None)
    assert (fits[1].basis, fits[1].reference, fits[1].covers_script) == (PREDICTED, "es", False)
    assert fits[0].to_json()["acceptance"] is None and fits[1].to_json()["coverage"] == 1.0
