"""A tiny multilingual run through the CLI (in process: tests/cli.py) on CPU: three languages, four prompts each,
6-token answers, a one-layer draft, held-out evaluation only (Dutch has no MT-Bench file). It stops after the hidden states, a second run that shares its data asks for a coverage target
no 16-token vocabulary can meet (refused, removed), and the first run then resumes to the end: per-language
coverage, held-out acceptance of every language, and a registered draft that knows its languages."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.cli import polyspec
from tests.training.conftest import pack_rows, write_jsonl

LANGS = ("en", "fr", "de")


def _train(*args: str, home: Path) -> subprocess.CompletedProcess:
    return polyspec("train", "run", *args, home=home, TOKENIZERS_PARALLELISM="false")


def test_tiny_multilingual_run(tmp_path: Path, shared_data: Path, verifier, registry_url: str) -> None:
    from polyspec.registry import open_registry

    files = [write_jsonl(tmp_path / f"{lang}.jsonl", pack_rows(shared_data, lang, "general", 4)) for lang in LANGS]
    knobs = ("--languages", ",".join(LANGS), *(a for f in files for a in ("--prompts", str(f))), "--verifier",
             str(verifier.path), "--max-new-tokens", "6", "--answer-batch-size", "16", "--layers", "1", "--epochs", "1",
             "--lr", "1e-3", "--warmup-steps", "1", "--total-seq-len", "256", "--eval-languages", "nl",
             "--eval-max-new-tokens", "6", "--device", "cpu", "--draft-name", "tiny-mul")
    data = _train(*knobs, "--run-id", "mul-a", "--until", "hidden-states", home=tmp_path)
    assert data.returncode == 0, data.stderr[-3000:]

    unmet = _train(*knobs, "--run-id", "mul-b", "--reuse-from", "mul-a", "--coverage-target", "1.0",
                   "--draft-vocab-size", "16", home=tmp_path)
    assert unmet.returncode == 2, unmet.stderr[-3000:]
    assert "--coverage-target 1.0: coverage target cannot be met with a 16-token vocabulary" in unmet.stderr
    assert "Traceback" not in unmet.stderr
    assert not (tmp_path / "runs" / "mul-b").exists() and (tmp_path / "runs" / "mul-a" / "hidden-states").is_dir()

    done = _train("--run-id", "mul-a", "--resume", "--json", home=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])["summary"]
    assert summary["languages"] == list(LANGS) and summary["device"] == "cpu"
    assert set(summary["seconds"]) >= {"prompts", "answers", "hidden-states", "vocab", "fit", "evaluate", "register"}
    assert all(summary["coverage"][lang] >= 0.95 for lang in LANGS)
    assert all(summary["data"][lang]["heldout"] >= 1 and summary["data"][lang]["train"] == 3 for lang in LANGS)
    heldout = summary["evaluation"]["candidate"]["heldout"]
    assert set(heldout) == set(LANGS) and all(heldout[lang] >= 1.0 for lang in LANGS)
    assert set(summary["evaluation"]["candidate_non_degenerate"]["heldout"]) == set(LANGS)
    run = tmp_path / "runs" / "mul-a"
    stats = json.loads((run / "prompts" / "stats.json").read_text())
    assert {lang: stats["languages"][lang]["files"] for lang in LANGS} == {lang: {f"{lang}.jsonl": 4} for lang in LANGS}
    coverage = json.loads((run / "vocab" / "coverage.json").read_text())
    assert coverage["size"] == 12288 and coverage["by_target"] > 0
    with open_registry(registry_url) as reg:
        draft = reg.get_draft("tiny-mul")
        assert draft.languages == list(LANGS) and draft.provenance["mix"]["source"] == "equal"
        assert {e.language for e in reg.evaluations("tiny-mul") if e.benchmark == "heldout"} == set(LANGS)
