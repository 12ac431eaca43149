"""The gate's decision (polyspec.adapt.gate.compare): the candidate must gain on its language's held-out live set over
all and over non-degenerate answers, and may lose at most the margin on every MT-Bench file, its own language's
included; no speculation is 1.0 per step.
(The measuring itself is `polyspec eval`'s, tested in tests/training; a real gate runs in tests/adapt/test_e2e.py.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polyspec.adapt.gate import Bench, benches, compare, failure_text, gain_benchmarks
from polyspec.adapt.settings import AdaptSettings


@dataclass
class Row:
    draft: str
    language: str
    subset: str
    mean_acceptance_length: float | None
    num_prompts: int = 8
    degenerate_share: float = 0.25


def _rows(lang: str, cand: tuple[float | None, float | None], base: tuple[float, float] | None) -> list[Row]:
    rows = [Row("candidate", lang, "all", cand[0]), Row("candidate", lang, "non_degenerate", cand[1])]
    if base:
        rows += [Row("baseline", lang, "all", base[0]), Row("baseline", lang, "non_degenerate", base[1])]
    return rows


def test_the_live_set_needs_a_gain_on_both_subsets() -> None:
    bench = Bench("/x/heldout.jsonl", "live-it-abababab", "it", True, gain=True)
    ok = compare(_rows("it", (1.30, 1.25), (1.20, 1.20)), bench, "baseline", 0.02, 0.02)
    assert [r["passed"] for r in ok] == [True, True] and ok[0]["change"] == 0.1
    half = compare(_rows("it", (1.30, 1.21), (1.20, 1.20)), bench, "baseline", 0.02, 0.02)
    assert [r["passed"] for r in half] == [True, False]
    assert "needs a gain of 0.02" in failure_text(half[1], 0.02, 0.02)


def test_the_languages_own_mtbench_may_lose_at_most_the_margin() -> None:
    """No gain is needed on the language's MT-Bench file (the live set is what the candidate serves), but it is
    compared with the draft serving the language, and a loss beyond the margin fails."""
    bench = Bench("mtbench:it", "mtbench-8", "it", True, limit=8)
    flat = compare(_rows("it", (1.19, 1.20), (1.20, 1.20)), bench, "baseline", 0.02, 0.02)
    assert [(r["passed"], r["required"]) for r in flat] == [(True, "no loss"), (True, "no loss")]
    worse = compare(_rows("it", (1.15, 1.20), (1.20, 1.20)), bench, "baseline", 0.02, 0.02)
    assert [r["passed"] for r in worse] == [False, True]
    assert "a loss of at most 0.02" in failure_text(worse[0], 0.02, 0.02)


def test_without_speculation_the_baseline_is_one_token_per_step() -> None:
    rows = compare(_rows("it", (1.01, 1.5), None), Bench("x", "live-it-1", "it", True, gain=True), None, 0.02, 0.02)
    assert [(r["before"], r["passed"]) for r in rows] == [(1.0, False), (1.0, True)]
    assert rows[0]["baseline"] == "no speculation"


def test_other_languages_may_lose_at_most_the_margin() -> None:
    bench = Bench("mtbench:en", "mtbench-8", "en", False)
    rows = compare(_rows("en", (1.43, 1.40), (1.45, 1.45)), bench, "baseline", 0.02, 0.03)
    assert [r["passed"] for r in rows] == [True, False]
    assert "a loss of at most 0.03" in failure_text(rows[1], 0.02, 0.03)


def test_an_empty_subset_is_not_compared() -> None:
    rows = compare(_rows("it", (1.3, None), (1.2, None)), Bench("x", "b", "it", True), "baseline", 0.02, 0.02)
    assert rows[1]["passed"] and rows[1]["change"] is None and "not compared" in rows[1]["note"]


def test_benches_cover_the_live_set_the_language_english_and_served_ones(monkeypatch) -> None:
    s = AdaptSettings(gate_questions=8)
    got = benches("it", Path("/x/heldout.jsonl"), "ab" * 32, ["de", "en", "xx"], s)
    assert [(b.spec, b.name, b.language, b.target, b.gain, b.limit) for b in got] == [
        ("/x/heldout.jsonl", "live-it-abababab", "it", True, True, None),
        ("mtbench:it", "mtbench-8", "it", True, False, 8),
        ("mtbench:de", "mtbench-8", "de", False, False, 8), ("mtbench:en", "mtbench-8", "en", False, False, 8)]
    no_file = benches("pt", Path("/x/h.jsonl"), "cd" * 32, [], s)  # no bundled MT-Bench for pt: held-out only
    assert [(b.language, b.target, b.gain) for b in no_file] == [("pt", True, True), ("en", False, False)]


@dataclass
class Candidate:
    provenance: dict


def test_the_swap_requires_the_gain_on_the_live_set_the_gate_measured() -> None:
    trained = Candidate({"adapt": {"dataset": {"heldout_sha256": "ab" * 32}}})
    assert gain_benchmarks(trained, "it") == ["live-it-abababab"]
    # A draft adapt did not train (or odd provenance): the gain is required on every benchmark of the language.
    for provenance in ({}, {"adapt": {}}, {"adapt": {"dataset": {"heldout_sha256": ""}}},
                       {"adapt": {"dataset": {"heldout_sha256": 7}}}):
        assert gain_benchmarks(Candidate(provenance), "it") is None
