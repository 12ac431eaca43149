"""sha256 checksums of artifacts (files and directory trees). Torch-free: the router imports this."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

_CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of one file, read in 1 MiB chunks so large weights never sit in memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_tree(root: str | Path, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """Relative posix path -> sha256 of every regular file under ``root``, sorted by path.

    ``exclude`` lists relative paths to leave out (e.g. the manifest that stores these checksums).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"not a directory: {root}")
    found: dict[str, str] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in exclude:
            continue
        found[rel] = sha256_file(path)
    return dict(sorted(found.items()))


def verify_tree(root: str | Path, expected: Mapping[str, str]) -> list[str]:
    """Compare the files under ``root`` with ``expected`` checksums.

    Returns human-readable problems (missing files, changed files); an empty list means the tree matches.
    Files present on disk but absent from ``expected`` are not problems: callers may add side files.
    """
    root = Path(root)
    problems: list[str] = []
    if not root.is_dir():
        return [f"{root} does not exist or is not a directory"]
    for rel, want in sorted(expected.items()):
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        got = sha256_file(path)
        if got != want:
            problems.append(f"{rel}: sha256 {got[:12]}… differs from recorded {want[:12]}…")
    return problems
