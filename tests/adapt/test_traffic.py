"""Captured prompts as training data (training.traffic): a seeded split whose held-out prompts never train,
checksummed files, watermarks that survive rotation, and hostile capture lines skipped and counted."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest

from polyspec.training import traffic
from polyspec.training.traffic import TrafficDataError, build_dataset, count_new, file_marks, read_captured, split
from tests.adapt.conftest import capture_lines, italian


def _records(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"p{i}", "lang": "it", "domain": "general", "prompt": p} for i, p in enumerate(italian(n, start), start)]


def test_split_is_seeded_and_a_held_out_prompt_never_trains_later() -> None:
    kw = dict(seed=7, heldout_fraction=0.2, min_heldout=1, max_heldout=1000)
    train, held, dropped = split(_records(100), **kw)
    assert split(_records(100), **kw)[:2] == (train, held)  # deterministic
    assert {r["id"] for r in train}.isdisjoint({r["id"] for r in held}) and dropped == 0
    assert 5 <= len(held) <= 40 and len(train) + len(held) == 100
    grown_train, grown_held, _ = split(_records(300), **kw)
    assert {r["id"] for r in held} <= {r["id"] for r in grown_held}  # still held out as the capture grows
    assert not {r["id"] for r in held} & {r["id"] for r in grown_train}
    other_seed = split(_records(100), **{**kw, "seed": 8})[1]
    assert {r["id"] for r in other_seed} != {r["id"] for r in held}


def test_caps_drop_surplus_held_out_prompts_instead_of_training_on_them() -> None:
    full = split(_records(200), seed=0, heldout_fraction=0.3, min_heldout=1, max_heldout=1000)[1]
    train, held, dropped = split(_records(200), seed=0, heldout_fraction=0.3, min_heldout=1, max_heldout=10)
    assert len(held) == 10 and dropped == len(full) - 10
    assert not {r["id"] for r in full} & {r["id"] for r in train}
    all_train = split(_records(200), seed=0, heldout_fraction=0.3, min_heldout=1, max_heldout=10)[0]
    train, _, _ = split(_records(200), seed=0, heldout_fraction=0.3, min_heldout=1, max_heldout=10, max_train=50)
    assert train == all_train[-50:]  # the newest prompts kept


def test_min_heldout_tops_up_from_the_lowest_scores() -> None:
    train, held, _ = split(_records(20), seed=0, heldout_fraction=0.01, min_heldout=5, max_heldout=100)
    assert len(held) == 5 and len(train) == 15


def test_build_dataset_writes_checksummed_files(tmp_path: Path) -> None:
    capture_lines(tmp_path / "cap", "it", italian(60))
    ds = build_dataset(tmp_path / "cap", "it", tmp_path / "out", seed=0, heldout_fraction=0.1, min_heldout=4)
    assert ds.train + ds.heldout == 60 and ds.heldout >= 4
    for path, digest, n in ((ds.train_path, ds.train_sha256, ds.train), (ds.heldout_path, ds.heldout_sha256, ds.heldout)):
        data = Path(path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest and len(data.splitlines()) == n
        assert all(json.loads(line)["lang"] == "it" for line in data.splitlines())
    assert ds.verify() == []
    Path(ds.heldout_path).write_text("tampered\n")
    assert "sha256 differs" in ds.verify()[0]
    os.unlink(ds.train_path)
    assert any("missing" in p for p in ds.verify())


def test_hostile_capture_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    cap = tmp_path / "cap"
    capture_lines(cap, "it", italian(3))
    with (cap / "it.jsonl").open("ab") as fh:
        fh.write(b"not json\n[1, 2]\n{\"prompt\": 5}\n{\"prompt\": \"   \"}\n\xff\xfe broken utf8\n")
        fh.write(json.dumps({"lang": "fr", "prompt": "Bonjour"}).encode() + b"\n")
        fh.write(json.dumps({"lang": "it", "prompt": "x" * 40_000}).encode() + b"\n")
        fh.write(json.dumps({"lang": "it", "prompt": italian(1)[0]}).encode() + b"\n")  # a duplicate
        fh.write(b'{"lang": "it", "prompt": "torn line being writ')  # no newline: a router is mid-write
    records, skipped = read_captured(cap, "it")
    assert len(records) == 3
    assert skipped == {"malformed": 2, "no_prompt": 3, "other_language": 1, "too_long": 1, "duplicate": 1}


def test_too_few_prompts_is_a_clear_error(tmp_path: Path) -> None:
    capture_lines(tmp_path / "cap", "it", italian(5))
    with pytest.raises(TrafficDataError, match="5 usable captured it prompts.*needs 20"):
        build_dataset(tmp_path / "cap", "it", tmp_path / "out", min_prompts=20)
    with pytest.raises(TrafficDataError, match="0 usable"):
        build_dataset(tmp_path / "nowhere", "it", tmp_path / "out", min_prompts=2)


def test_watermarks_count_new_prompts_across_rotation(tmp_path: Path) -> None:
    cap = tmp_path / "cap"
    active = capture_lines(cap, "it", italian(10))
    assert count_new(cap, "it") == 10
    marks = file_marks(cap, "it")
    assert count_new(cap, "it", marks) == 0
    capture_lines(cap, "it", italian(4, 100))
    assert count_new(cap, "it", marks) == 4
    active.rename(cap / "it-20261202T101010.000001Z.jsonl")  # the router rotates: same inode, new name
    capture_lines(cap, "it", italian(3, 200))  # a new active file
    assert count_new(cap, "it", marks) == 4 + 3
    assert count_new(cap, "fr", marks) == 0
    assert [p.name for p in traffic.capture_files(cap, "it")] == ["it-20261202T101010.000001Z.jsonl", "it.jsonl"]


def test_a_full_disk_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    capture_lines(tmp_path / "cap", "it", italian(30))
    real = traffic._write

    def full(path: Path, data: bytes) -> None:
        if path.name == "heldout.jsonl":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(traffic, "_write", full)
    with pytest.raises(OSError, match="No space"):
        build_dataset(tmp_path / "cap", "it", tmp_path / "out", min_heldout=2)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train.jsonl"]  # whole, or absent


def test_free_bytes_reads_the_nearest_existing_parent(tmp_path: Path) -> None:
    assert traffic.free_bytes(tmp_path / "not" / "yet") > 0


def test_replay_mixes_other_languages_without_their_held_out_prompts(tmp_path: Path) -> None:
    cap = tmp_path / "cap"
    capture_lines(cap, "it", italian(40))
    capture_lines(cap, "en", [f"English question number {i} about the weather tomorrow?" for i in range(60)])
    capture_lines(cap, "fr", [f"Question numéro {i} sur la météo de demain ?" for i in range(20)])
    ds = build_dataset(cap, "it", tmp_path / "out", seed=3, heldout_fraction=0.2, min_heldout=2)
    ds = traffic.add_replay(ds, cap, ["en", "fr", "de"], 1.0, seed=3, heldout_fraction=0.2)
    rows = [json.loads(line) for line in Path(ds.replay_path).read_text().splitlines()]
    assert len(rows) == sum(ds.replay.values()) == ds.train  # one replay prompt per training prompt
    assert set(ds.replay) == {"en", "fr"} and ds.replay["en"] > ds.replay["fr"]
    assert all(traffic.heldout_score(3, r["prompt"]) >= 0.2 for r in rows)  # their held-out never trains
    assert ds.verify() == []
    Path(ds.replay_path).write_text("x\n")
    assert ds.verify() and "replay.jsonl" in ds.verify()[0]
    alone = build_dataset(cap, "it", tmp_path / "alone", min_heldout=2)
    assert traffic.add_replay(alone, cap, ["de"], 1.0).replay_path is None  # nothing captured: no replay
    assert traffic.add_replay(alone, cap, ["en"], 0.0).replay_path is None
