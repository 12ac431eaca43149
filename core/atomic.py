"""Atomic file writes: readers see the old file or the new one, never half of either.

Write to a temporary file in the same directory, flush and fsync it, rename it over the target, then
fsync the directory so the rename survives a crash. The result gets the normal mode for a new file
(0666 minus the umask), not mkstemp's 0600: these files are read by other users and by containers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _umask_mode() -> int:
    return 0o666 & ~_umask()


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot open or fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path, *, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` atomically.

    For writers that want a file name (``torch.save``, ``safetensors.save_file``). On any exception the
    temporary file is removed and ``path`` is left as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, _umask_mode() if mode is None else mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def atomic_write_bytes(path: str | Path, data: bytes, *, mode: int | None = None) -> None:
    with atomic_path(path, mode=mode) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str, *, mode: int | None = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(path: str | Path, data: Any, *, indent: int | None = 2) -> None:
    """JSON with non-ASCII kept readable and a final newline; unknown types go through ``str``."""
    atomic_write_text(path, json.dumps(data, indent=indent, ensure_ascii=False, default=str) + "\n")


def _normal_modes(root: Path) -> None:
    dir_mode, file_mode = 0o777 & ~_umask(), _umask_mode()
    os.chmod(root, dir_mode)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), dir_mode)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, file_mode | (os.stat(path).st_mode & 0o111))


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; on success it replaces ``path`` whole.

    An existing ``path`` is moved aside first and removed only after the new one is in place, so a
    crash leaves either the old directory or the new one (plus a hidden leftover), never a mix. The
    result gets normal modes (0777/0666 minus the umask) throughout, not mkdtemp's 0700 or the 0600 that
    ``save_pretrained`` and mkstemp leave: drafts and verifiers are read by vLLM processes of other users.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        yield tmp
        _normal_modes(tmp)
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
