"""The unseen-language prompt sets (bench/data/unseen): each parses as a benchmark, is big enough, is for a
language the data pack does not train on, matches its build, and is documented with a source and licence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.data.unseen.build import SOURCES, build
from polyspec.training.benchmarks import load_benchmark

UNSEEN = Path(__file__).resolve().parents[2] / "bench" / "data" / "unseen"
FILES = sorted(UNSEEN.glob("*.jsonl"))
TRAINED = {"en", "fr", "de", "es", "it", "ru", "zh", "ja", "ko", "ar", "hi", "th", "pt", "id", "nl", "pl", "tr", "vi"}


def test_every_language_of_the_build_has_a_file() -> None:
    assert {p.stem for p in FILES} == set(SOURCES)
    assert len(FILES) >= 3


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_file_parses_with_at_least_40_prompts_in_its_own_unseen_language(path: Path) -> None:
    items = load_benchmark(path)
    assert len(items) >= 40
    assert {item.language for item in items} == {path.stem}
    assert path.stem not in TRAINED
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert all(r["source"] and r["license"] for r in records)
    assert len({r["prompt"].casefold() for r in records}) == len(records)  # no duplicate prompt


@pytest.mark.parametrize("lang", sorted(SOURCES))
def test_file_is_what_the_build_writes(lang: str) -> None:
    assert (UNSEEN / f"{lang}.jsonl").read_text(encoding="utf-8") == build(lang)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_readme_names_source_and_licence_of_each_file(path: Path) -> None:
    row = next((ln for ln in (UNSEEN / "README.md").read_text(encoding="utf-8").splitlines()
                if ln.startswith(f"| `{path.name}` |") and "@" in ln), None)
    assert row is not None, f"README has no table row for {path.name}"
    _, _, source, licence = SOURCES[path.stem]
    assert f"`{source}`" in row
    assert re.search(rf"\|\s*{re.escape(licence)}\s*\|\s*$", row)
