"""Build core/langid_han_table.py: how much more often Japanese than Chinese writes each Han character, from
the data pack's training prompts (train/ja.jsonl, train/zh.jsonl and train/more/{ja,zh}.jsonl.gz without the
sample bench/langid.py holds out; never MT-Bench, the evaluation set).

Each character's log-odds ``log P(c | ja) - log P(c | zh)`` (add-``ALPHA`` smoothing over the characters
seen) is kept where it is at least ``MIN_LOG_ODDS`` either way and the character was seen ``MIN_COUNT`` times,
in steps of ``STEP``, clipped to ``CLIP``. The product reads the generated module, never the data pack.

    .venv/bin/python scripts/langid_han_table.py            # rewrite core/langid_han_table.py
    .venv/bin/python scripts/langid_han_table.py --check    # exit 1 when it differs from what the pack gives
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import DATA, read_jsonl  # noqa: E402
from bench.langid import _more  # noqa: E402
from polyspec.core.atomic import atomic_write_text  # noqa: E402
from polyspec.core.langid_script import _HAN  # noqa: E402

OUT = ROOT / "core" / "langid_han_table.py"
HELD_OUT = 200  # bench/langid.py's held-out sample: the first 200 of each seeded shuffle of train/more
ALPHA = 0.5
MIN_COUNT = 3
MIN_LOG_ODDS = 0.5
STEP = 0.25
CLIP = 6.0
_HAN_RE = re.compile(f"[{_HAN}]")


def prompts(lang: str) -> list[str]:
    rows = [r["prompt"] for r in read_jsonl(DATA / "train" / f"{lang}.jsonl")]
    return rows + _more(lang, 10**9, skip=HELD_OUT)


def table() -> dict[int, str]:
    counts = {lang: Counter(c for text in prompts(lang) for c in _HAN_RE.findall(text)) for lang in ("ja", "zh")}
    chars = set(counts["ja"]) | set(counts["zh"])
    totals = {lang: sum(c.values()) + ALPHA * len(chars) for lang, c in counts.items()}
    buckets: dict[int, list[str]] = {}
    for char in sorted(chars):
        if counts["ja"][char] + counts["zh"][char] < MIN_COUNT:
            continue
        odds = math.log((counts["ja"][char] + ALPHA) / totals["ja"]) - math.log((counts["zh"][char] + ALPHA) / totals["zh"])
        if abs(odds) < MIN_LOG_ODDS:
            continue
        step = round(max(-CLIP, min(CLIP, odds)) / STEP)
        buckets.setdefault(step, []).append(char)
    return {step: "".join(chars) for step, chars in sorted(buckets.items())}


def render(buckets: dict[int, str]) -> str:
    lines = ['"""Han characters by how much more often Japanese writes them than Chinese (generated: do not edit).',
             "", "Built by scripts/langid_han_table.py from the data pack's training prompts (not MT-Bench); read by",
             "core/langid_han.py. ``BUCKETS[i]`` holds the characters whose log-odds ja:zh is about ``i * STEP``.",
             '"""', "", f"STEP = {STEP}", "BUCKETS: dict[int, str] = {"]
    for step, chars in buckets.items():
        lines.append(f"    {step}: (")
        lines += [f'        "{chars[i:i + 60]}"' for i in range(0, len(chars), 60)]
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    text = render(table())
    if sys.argv[1:] == ["--check"]:
        return 0 if OUT.read_text(encoding="utf-8") == text else 1
    atomic_write_text(OUT, text)
    print(f"wrote {OUT} ({len(text.encode()):,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
