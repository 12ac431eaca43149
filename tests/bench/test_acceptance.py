"""bench/acceptance.py: the results contract regenerated from a registry, through its command line (in process)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli import invoke

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"draft", "role", "target_language", "language", "k", "positions", "mean_acceptance_length", "n_prompts", "method",
        "subset", "degenerate_share"}


def _run(*args: str, env_registry: str | None = None) -> subprocess.CompletedProcess:
    """`python bench/acceptance.py ARGS`, in process (tests/cli.py)."""
    from bench.acceptance import main

    return invoke(main, *args, **({"POLYSPEC_REGISTRY_URL": env_registry} if env_registry else {}))


def test_from_shipped_writes_the_contract(tmp_path, verifier):
    proc = _run("--from-shipped", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = json.loads((tmp_path / "acceptance.json").read_text())
    assert records and all(KEYS <= set(r) for r in records)
    assert all(len(r["positions"]) == r["k"] and r["method"] in ("offline", "vllm") for r in records)
    # teacher-forced figures at k = 3; a vLLM engine's at the k it serves (the multilingual draft's k = 4)
    assert {r["k"] for r in records if r["method"] == "offline"} == {3}
    for r in records:  # the contract's arithmetic: MAL = 1 + sum of positions, positions non-increasing
        assert r["mean_acceptance_length"] == pytest.approx(1 + sum(r["positions"]), abs=1e-3)
        assert r["positions"] == sorted(r["positions"], reverse=True)
    base = {r["language"]: r for r in records if r["role"] == "base"}
    fr = {r["language"]: r for r in records if r["target_language"] == "fr"}
    assert {"en", "fr"} <= set(base) and fr["fr"]["role"] == "finetuned"
    assert fr["fr"]["mean_acceptance_length"] > base["fr"]["mean_acceptance_length"]  # the founding observation
    assert (tmp_path / "acceptance_positions.png").stat().st_size > 1000
    assert "mean acceptance length" in proc.stdout


def test_empty_registry_is_a_clear_error(tmp_path):
    proc = _run("--out", str(tmp_path), env_registry=f"sqlite:///{tmp_path / 'empty.db'}")
    assert proc.returncode == 1
    assert "no evaluation" in proc.stdout
    assert not (tmp_path / "acceptance.json").exists()


RESULTS = ROOT / "docs" / "results" / "registry.json"


def test_results_export_merges_every_founding_draft_once(tmp_path, verifier):
    proc = _run("--from-shipped", "--results", str(RESULTS), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = json.loads((tmp_path / "acceptance.json").read_text())
    export = json.loads(RESULTS.read_text())
    assert {f"{d['name']}@{d['version']}" for d in export["drafts"]} <= {r["draft"] for r in records}
    keys = [(r["draft"], r["benchmark"], r["language"], r["method"], r["subset"]) for r in records]
    assert len(keys) == len(set(keys))  # shipped drafts' evaluations are in both sources, recorded once
    mal = {(r["draft"].split("instruct-")[1].split("@")[0], r["benchmark"], r["language"], r["method"]):
           r["mean_acceptance_length"] for r in records if r["subset"] == "all"}
    # the custom-vocabulary Russian draft against the English base, on Russian
    assert mal[("ru", "mtbench-160", "ru", "offline")] > mal[("en", "mtbench-160", "ru", "offline")] + 1.0
    # (The offline-vs-vLLM cross-check on 12 prompts lived in the manifest entries of the drafts shipped until
    # 2026-12-03; the shipped Russian draft keeps it, tests/models/test_shipped_vllm.py.)
    tables = (tmp_path / "acceptance_tables.md").read_text()
    assert "### mtbench-160" in tables and "### humaneval-xl-heldout" in tables


def test_results_file_errors_are_clear(tmp_path, verifier):
    proc = _run("--from-shipped", "--results", str(tmp_path / "nope.json"), "--out", str(tmp_path))
    assert proc.returncode == 2 and "no such results file" in proc.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something-else", "version": 1}))
    proc = _run("--from-shipped", "--results", str(bad), "--out", str(tmp_path))
    assert proc.returncode == 1 and "cannot merge" in proc.stdout
    assert not (tmp_path / "acceptance.json").exists()
