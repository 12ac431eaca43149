"""docs/training.md's multilingual GPU blocks are what scripts/multilingual_report.py makes of
docs/results/multilingual.json, and that file holds every stage's seconds and every language's figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
