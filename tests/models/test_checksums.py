from __future__ import annotations

import hashlib
from pathlib import Path

from polyspec.models.checksums import sha256_file, sha256_tree, verify_tree


def test_sha256_tree_and_verify(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "sub" / "a.bin").write_bytes(b"\x00" * (3 << 20))  # spans several read chunks
    tree = sha256_tree(tmp_path)
    assert list(tree) == ["b.txt", "sub/a.bin"]
    assert tree["sub/a.bin"] == hashlib.sha256(b"\x00" * (3 << 20)).hexdigest()
    assert sha256_file(tmp_path / "b.txt") == hashlib.sha256(b"bee").hexdigest()
    assert verify_tree(tmp_path, tree) == []

    (tmp_path / "b.txt").write_text("wasp")
    (tmp_path / "sub" / "a.bin").unlink()
    problems = verify_tree(tmp_path, tree)
    assert len(problems) == 2
    assert any(p.startswith("b.txt: sha256") for p in problems)
    assert "sub/a.bin: missing" in problems


def test_sha256_tree_excludes(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "x").write_text("x")
    assert list(sha256_tree(tmp_path, exclude=("manifest.json",))) == ["x"]
