"""docs/training.md's multilingual GPU blocks are what scripts/multilingual_report.py makes of
docs/results/multilingual.json, and that file holds every stage's seconds and every language's figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import multilingual_report as report  # noqa: E402


def test_training_page_holds_the_generated_blocks() -> None:
    data = json.loads(report.RESULTS.read_text(encoding="utf-8"))
    page = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    assert "\n".join(report.seconds_block(data)) in page
    assert "\n".join(report.figures_block(data)) in page


def test_the_gpu_run_covers_every_stage_and_language() -> None:
    data = json.loads(report.RESULTS.read_text(encoding="utf-8"))
    assert len(data["languages"]) == 18 and data["device"].startswith("cuda")
    assert all(data["seconds"][s] > 0 for s in report.STAGES)
    assert all(data["coverage"][lang] >= 0.95 for lang in data["languages"])
    assert set(data["figures"]["heldout"]) == set(data["languages"])
    assert len(data["figures"]["mtbench"]) == 9 and data["mtbench_turns"] == [1, 2]


def test_the_warm_started_run_has_its_own_blocks_and_ship_criterion() -> None:
    """The shipped run (warm start from the English base) has its own blocks in docs/training.md, and its targets
    and ship criterion against the drafts it was measured against in docs/results.md."""
    warm = ROOT / "docs" / "results" / "multilingual-warm.json"
    data = json.loads(warm.read_text(encoding="utf-8"))
    training = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    assert "\n".join(report.seconds_block(data, warm.stem)) in training
    assert "\n".join(report.figures_block(data, warm.stem)) in training
    assert "\n".join(report.compare_block(data, warm.stem)) in (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert len(data["languages"]) == 18 and all(data["seconds"][s] > 0 for s in report.STAGES)
    assert set(data["figures"]["heldout"]) == set(data["languages"]) and len(data["figures"]["mtbench"]) == 9
    assert {"smollm2-135m-instruct-en", "smollm2-135m-instruct-multi"} <= set(data["reference"])


def test_ship_verdict_needs_english_better_and_the_others_within_the_margin() -> None:
    def run(en: float, fr: float) -> dict:
        mt = {lang: {"all": 3.0} for lang in report.MTBENCH} | {"en": {"all": en}, "fr": {"all": fr}}
        ref = {lang: {"all": 3.0} for lang in report.MTBENCH} | {"en": {"all": 2.1}}
        return {"figures": {"mtbench": mt}, "reference": {"smollm2-135m-instruct-multi": ref}}

    assert report.ship_verdict(run(2.2, 2.95))[0]
    ok, reasons = report.ship_verdict(run(2.2, 2.85))
    assert not ok and "fr 2.850 against 3.000 (-0.150, fails)" in reasons
    assert not report.ship_verdict(run(2.1, 3.0))[0]  # English must be better, not equal


def test_unseen_languages_fold_into_one_row_per_language(tmp_path: Path) -> None:
    """`polyspec eval --json` over languages in no training set becomes one row per language, one column per
    draft, all / non-degenerate answers."""
    def rec(draft: str, lang: str, subset: str, mal: float | None) -> dict:
        return {"draft": draft, "language": lang, "subset": subset, "mean_acceptance_length": mal,
                "num_answers": 20, "degenerate_share": 0.25}

    records = [rec("new", "uk", "all", 2.5), rec("new", "uk", "non_degenerate", 2.0),
               rec("base", "uk", "all", 1.4), rec("base", "uk", "non_degenerate", None)]
    (tmp_path / "results.json").write_text(json.dumps({"method": "offline", "options": {"k": 3},
                                                       "records": records}), encoding="utf-8")
    data = report.fold_unseen(tmp_path)
    assert data["drafts"] == ["new", "base"] and data["k"] == 3
    block = report.unseen_block(data, "multilingual-unseen")
    assert "| language | answers | new | base |" in block
    assert "| uk | 20 | 2.500 / 2.000 | 1.400 / – |" in block
    assert block[0] == report.marks("multilingual-unseen", "table")[0]


def test_unseen_languages_fold_one_eval_output_per_language_file(tmp_path: Path) -> None:
    """One `polyspec eval --json` output per language file folds into the same table, its settings in the
    caption; outputs made with other settings are refused rather than mixed."""
    def out(lang: str, mal: float, tokens: int = 128) -> dict:
        records = [{"draft": d, "language": lang, "subset": s, "mean_acceptance_length": mal + i,
                    "num_answers": 30, "degenerate_share": 0.1} for i, d in enumerate(("base", "multi"))
                   for s in ("all", "non_degenerate")]
        return {"method": "offline", "seconds": {"total": 10.0}, "records": records,
                "options": {"k": 3, "max_new_tokens": tokens, "device": "cpu", "dtype": None, "language": lang}}

    for lang, mal in (("uk", 1.5), ("da", 1.25)):
        (tmp_path / f"{lang}.json").write_text(json.dumps(out(lang, mal)), encoding="utf-8")
    data = report.fold_unseen(tmp_path, command="polyspec eval ...")
    assert data["drafts"] == ["base", "multi"] and data["seconds"] == 20.0 and data["command"] == "polyspec eval ..."
    block = report.unseen_block(data, "multilingual-unseen")
    assert block.index("| da | 30 | 1.250 / 1.250 | 2.250 / 2.250 |") < block.index("| uk | 30 | 1.500 / 1.500 | 2.500 / 2.500 |")
    assert "offline, cpu, float32, at most 128 new tokens per answer" in block[2] and "MT-Bench" in block[2]
    (tmp_path / "ro.json").write_text(json.dumps(out("ro", 1.0, tokens=64)), encoding="utf-8")
    with pytest.raises(SystemExit, match="ro.json: measured with other settings"):
        report.fold_unseen(tmp_path)



def test_results_page_holds_the_unseen_language_table() -> None:
    """docs/results.md §16's unseen-language table is the rendering of docs/results/multilingual-unseen.json:
    the English base and the multilingual draft on all seven files of bench/data/unseen."""
    unseen = ROOT / "docs" / "results" / "multilingual-unseen.json"
    data = json.loads(unseen.read_text(encoding="utf-8"))
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert "\n".join(report.unseen_block(data, unseen.stem)) in page
    assert data["drafts"] == ["smollm2-135m-instruct-en", "smollm2-135m-instruct-multi"]
    files = {f.stem for f in (ROOT / "bench" / "data" / "unseen").glob("*.jsonl")}
    assert all(set(data["figures"][d]) == files for d in data["drafts"])
