"""Transparent huge pages for a process's large anonymous memory (Linux), once its models are loaded.

A router's language models (fastText's tables, lingua's, the word lists) and the interpreter's heap are
hundreds of MiB that every request reads at scattered places. With 4 KiB pages, a read of a table that other
work has pushed out of the caches also misses the TLB, and in a virtual machine that miss walks two page
tables. Backed by 2 MiB pages, the same memory needs 512 times fewer TLB entries.

`advise` asks the kernel for that on every private anonymous read-write mapping of at least ``min_bytes``
and on the heap: ``madvise(MADV_HUGEPAGE)`` (khugepaged may then collapse the range in the background) and
``madvise(MADV_COLLAPSE)`` (Linux 6.1 and later: collapse it now, pages already resident included). It
changes where the memory lives, never what it holds. A kernel without transparent huge pages, set to
``never``, or that refuses a range leaves the memory as it was; off Linux it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path
from typing import Any

MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20
MAPS = Path("/proc/self/maps")


def candidate_ranges(maps: str, min_bytes: int = HUGE_PAGE) -> list[tuple[int, int]]:
    """(start, end) of the private anonymous read-write mappings of at least ``min_bytes`` in ``maps`` (the text
    of /proc/self/maps), the heap included; file mappings, stacks and shared memory are left out."""
    out = []
    for line in maps.splitlines():
        parts = line.split()
        if len(parts) < 5 or not parts[1].startswith("rw") or parts[1][3:4] != "p":
            continue
        name = parts[5] if len(parts) > 5 else ""
        if name not in ("", "[heap]"):
            continue
        start, _, end = parts[0].partition("-")
        low, high = int(start, 16), int(end, 16)
        if high - low >= min_bytes:
            out.append((low, high))
    return out


def anon_huge_bytes() -> int | None:
    """AnonHugePages of this process (/proc/self/smaps_rollup), in bytes; None where it cannot be read."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return None


def advise(min_bytes: int = HUGE_PAGE) -> dict[str, Any]:
    """Ask for huge pages on this process's large anonymous mappings (the module says how); returns what was
    asked and what the kernel did: ranges and bytes advised, ranges collapsed, AnonHugePages after."""
    if not sys.platform.startswith("linux") or not MAPS.is_file():
        return {"ranges": 0, "advised_bytes": 0, "collapsed": 0, "anon_huge_bytes": None}
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    ranges = candidate_ranges(MAPS.read_text(), min_bytes)
    advised = collapsed = 0
    for low, high in ranges:
        if madvise(low, high - low, MADV_HUGEPAGE) == 0:
            advised += high - low
            collapsed += madvise(low, high - low, MADV_COLLAPSE) == 0
    return {"ranges": len(ranges), "advised_bytes": advised, "collapsed": collapsed,
            "anon_huge_bytes": anon_huge_bytes()}
