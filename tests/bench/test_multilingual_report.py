"""scripts/multilingual_report.py: the ship verdict, and unseen-language evaluations folded into one row per
language (its blocks in docs/ are checked with the other docs in test_docs_results.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import multilingual_report as report  # noqa: E402


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
