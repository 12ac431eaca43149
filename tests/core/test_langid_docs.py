"""docs/languages.md's language-ID figures are bench/langid_routes.py's rendering of the committed langid.json,
and that run meets the short-prompt targets: first two words >= 92 % overall and >= 80 % in every language,
on MT-Bench and on the held-out train sample, with and without a restriction."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "benchmarks" / "langid.json"


def test_the_page_shows_the_committed_run() -> None:
    from bench.langid_routes import BEGIN, END, markdown

    page = (ROOT / "docs" / "languages.md").read_text(encoding="utf-8")
    block = page.split(BEGIN, 1)[1].split(END, 1)[0]
    assert block.strip() == "\n".join(markdown(json.loads(RUN.read_text(encoding="utf-8")))).strip(), (
        "regenerate with: .venv/bin/python bench/langid_routes.py --docs")


def test_the_committed_run_meets_the_short_prompt_targets() -> None:
    data = json.loads(RUN.read_text(encoding="utf-8"))
    assert not data["quick"] and data["texts"] == "heldout"
    targets = data["first_two_words_targets"]
    for source in ("mtbench", "more"):
        for mode in ("unrestricted", "restricted"):
            acc = data["first_two_words"][source][mode]["distinct"]
            assert acc["all"] >= targets["overall"], (source, mode, acc["all"])
            assert acc["min"] >= targets["min_language"], (source, mode, acc)
    costs = data["wrong_label_cost"]["languages"]
    assert {"en", "fr", "ja", "zh"} <= set(costs)
    assert all(row[fleet]["tps"] > 0 for row in costs.values() for fleet in ("specialist", "best_draft"))
    micro = data["per_call_us"]
    assert micro["before_ref"] and micro["now"]["restricted"]["2w"] > 0 and micro["before"]["restricted"]["2w"] > 0
