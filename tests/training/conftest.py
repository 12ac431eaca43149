"""Training fixtures: small prompt files cut from the shared data pack, and run-config helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def pack_rows(shared_data: Path, lang: str, domain: str | None = None, n: int | None = None) -> list[dict]:
    rows = [json.loads(line) for line in (shared_data / "train" / f"{lang}.jsonl").read_text(encoding="utf-8").splitlines()]
    if domain:
        rows = [r for r in rows if r["domain"] == domain]
    return rows[:n] if n else rows


@pytest.fixture(scope="session")
def fr_prompts(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 short French instruction prompts (M-IFEval): 40 for training, 8 held out."""
    out = tmp_path_factory.mktemp("prompts") / "fr.jsonl"
    return write_jsonl(out, pack_rows(shared_data, "fr", "general", 48))


@pytest.fixture(scope="session")
def en_prompts(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prompts") / "en.jsonl"
    return write_jsonl(out, pack_rows(shared_data, "en", "general", 30))
