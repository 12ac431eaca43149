"""Han characters' vote between Japanese and Chinese (core/langid_han.py) and its generated table."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from polyspec.core import langid_han
from polyspec.core.langid import detect

ROOT = Path(__file__).resolve().parents[2]
BOTH = frozenset({"ja", "zh", "en"})
# Kanji-only Japanese (shinjitai forms) and simplified Chinese, written for the test.
JAPANESE = ["経済対策", "国際関係", "駅前広場", "気象情報", "売買契約"]
CHINESE = ["经济政策", "这个问题", "我们需要", "请写一篇", "国际关系"]


@pytest.mark.parametrize("text", JAPANESE)
def test_kanji_only_japanese_is_japanese(text: str) -> None:
    assert langid_han.probabilities(text, BOTH)["ja"] > 0.9
    assert detect(text).language == "ja"
    assert detect(text, restrict=["ja", "zh", "en"]).language == "ja"


@pytest.mark.parametrize("text", CHINESE)
def test_simplified_chinese_is_chinese(text: str) -> None:
    assert langid_han.probabilities(text, BOTH)["zh"] > 0.9
    assert detect(text).language == "zh"


@pytest.mark.parametrize(("text", "candidates"), [
    ("経済対策", frozenset({"ja", "en"})),  # one of the two is not a candidate: nothing to choose
    ("hello", BOTH), ("", BOTH), ("Привет", BOTH), ("🙂🙂", BOTH), ("ー〜・", BOTH),
])
def test_no_vote_without_both_languages_or_han(text: str, candidates: frozenset[str]) -> None:
    assert langid_han.probabilities(text, candidates) == {}


def test_probabilities_sum_to_one_and_a_huge_text_costs_a_bounded_amount() -> None:
    p = langid_han.probabilities("这是経済", BOTH)
    assert sum(p.values()) == pytest.approx(1.0)
    huge = "経済" * 1_000_000
    start = time.perf_counter()
    assert langid_han.probabilities(huge, BOTH)["ja"] > 0.99
    assert time.perf_counter() - start < 0.01  # the first MAX_CHARS Han characters only


def test_the_table_is_what_the_training_prompts_give(shared_data: Path) -> None:
    """core/langid_han_table.py is generated from the data pack's train prompts and matches them."""
    done = subprocess.run([sys.executable, "scripts/langid_han_table.py", "--check"], cwd=ROOT, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert (ROOT / "core" / "langid_han_table.py").stat().st_size < 64_000
