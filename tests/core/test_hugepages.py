"""core.hugepages: which mappings are asked for huge pages, and that asking changes no byte of them."""

from __future__ import annotations

import mmap
import os
import platform
import sys
from pathlib import Path

from polyspec.core import hugepages
from polyspec.core.hugepages import HUGE_PAGE, candidate_ranges

MAPS = """\
55d0c0000000-55d0c0400000 r-xp 00000000 08:01 1234    /usr/bin/python3.11
55d0c2000000-55d0c5000000 rw-p 00000000 00:00 0       [heap]
7f0000000000-7f0000800000 rw-p 00000000 00:00 0
7f0000800000-7f0000900000 rw-p 00000000 00:00 0
7f0001000000-7f0002000000 rw-s 00000000 00:01 77      /dev/shm/segment
7f0003000000-7f0004000000 rw-p 00000000 08:01 999     /data/model.bin
7f0005000000-7f0006000000 r--p 00000000 00:00 0
7ffc00000000-7ffc00400000 rw-p 00000000 00:00 0       [stack]
"""


def test_only_large_private_anonymous_writable_mappings_and_the_heap_are_candidates() -> None:
    assert candidate_ranges(MAPS) == [(0x55D0C2000000, 0x55D0C5000000), (0x7F0000000000, 0x7F0000800000)]
    # the 1 MiB mapping is below the default minimum of one huge page, not below a smaller one
    assert (0x7F0000800000, 0x7F0000900000) in candidate_ranges(MAPS, min_bytes=1 << 20)
    assert candidate_ranges("") == [] and candidate_ranges("garbage line\n") == []


def _kernel_collapses() -> bool:
    """Transparent huge pages on (madvise or always) and MADV_COLLAPSE (Linux 6.1 and later)."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return "[never]" not in mode and (major, minor) >= (6, 1)


def test_advising_a_mapping_keeps_every_byte_and_reports_what_it_did() -> None:
    size = 8 * HUGE_PAGE
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        pattern = os.urandom(4096)
        for offset in range(0, size, 4096):
            region[offset:offset + 4096] = pattern
        result = hugepages.advise()
        assert set(result) == {"ranges", "advised_bytes", "collapsed", "anon_huge_bytes"}
        if not sys.platform.startswith("linux"):
            assert result["ranges"] == 0 and result["advised_bytes"] == 0
            return
        assert result["advised_bytes"] >= size  # the mapping above was among the ranges asked for
        if _kernel_collapses():
            assert result["collapsed"] >= 1 and result["anon_huge_bytes"]
        assert all(region[offset:offset + 4096] == pattern for offset in range(0, size, 4096))
    finally:
        region.close()
