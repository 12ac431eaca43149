"""Language ID over many texts: `core.langid_batch.detect_stream` on one process and on several gives the
same answers in the same order, and `polyspec langid` streams its input (any length, endless lines, bad
bytes) with bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from polyspec.core.langid import detect_many
from polyspec.core.langid_batch import detect_stream
from tests.core.test_langid import SENTENCES

TEXTS = [*SENTENCES.values(), "Bonne nuit", "Buenas noches", "", "Guten Tag", "Hello world", "Completa la frase", "Peter Jones"]


@pytest.mark.parametrize("restrict", [None, ["fr", "es", "de", "en"]], ids=["all-labels", "restricted"])
def test_several_processes_answer_as_one_in_input_order(restrict) -> None:
    texts = [f"{t} {i}" if i % 7 else t for i, t in enumerate(TEXTS * 12)]  # several chunks, small ones too
    serial = list(detect_stream(texts, restrict))
    parallel = list(detect_stream(texts, restrict, workers=2, chunk=16))
    assert len(parallel) == len(texts) > 3 * 16
    assert [g.language for g in parallel] == [g.language for g in serial]
    assert [g.confidence for g in parallel] == pytest.approx([g.confidence for g in serial], abs=1e-9)
    assert [g.language for g in serial] == [g.language for g in detect_many(texts, restrict)]
    with pytest.raises(ValueError, match="at least 1"):
        list(detect_stream(texts, workers=0))


def _cli(args: list[str], data: bytes) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polyspec.cli", "langid", *args], input=data, capture_output=True,
                          timeout=300)


def test_cli_streams_long_input_on_two_workers_like_one() -> None:
    lines = [t.replace("\n", " ") for t in TEXTS] * 60
    data = ("\n".join(lines) + "\n").encode()
    one, two = _cli(["--json"], data), _cli(["--json", "--workers", "2"], data)
    assert one.returncode == two.returncode == 0, two.stderr
    rows = [json.loads(line) for line in two.stdout.splitlines()]
    assert len(rows) == len(lines) and [r["text"] for r in rows] == lines
    assert two.stdout == one.stdout


def test_cli_bounds_endless_lines_and_replaces_bad_bytes() -> None:
    endless = b"bonjour " * (600_000)  # 4.8 MB on one line
    data = b"Bonne nuit\n" + endless + b"\n\xff\xfeGuten Tag\n\nlast line without end"
    out = _cli(["--json"], data)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["language"] for r in rows] == ["fr", "fr", "de", "und", "en"]
    assert len(rows[1]["text"].encode()) == 1 << 20  # the first MiB of the endless line, the rest dropped
    assert rows[2]["text"] == "\ufffd\ufffdGuten Tag" and rows[4]["text"] == "last line without end"
    bad = _cli(["--workers", "0"], b"Bonne nuit\n")
    assert bad.returncode == 2 and "workers" in bad.stderr.decode()
