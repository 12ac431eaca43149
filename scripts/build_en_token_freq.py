"""Rebuild models/data/en_token_freq.json: token counts of the bundled verifier's tokenizer over English prompts.

Sources: ../shared/data/train/en.jsonl (prompts) and training/data/mtbench/en.jsonl (MT-Bench turns).
Usage: .venv/bin/python scripts/build_en_token_freq.py [--train PATH] [--verifier SPEC] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polyspec.core.atomic import atomic_write_text  # noqa: E402
from polyspec.models.vocab_ref import EN_FREQ_FILE, MTBENCH_EN, count_tokens, load_tokenizer, mtbench_en_turns  # noqa: E402
from polyspec.models.vocab_ref import tokenizer_fingerprint  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, default=ROOT.parent / "shared" / "data" / "train" / "en.jsonl")
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, default=EN_FREQ_FILE)
    args = parser.parse_args()

    from rich.progress import track

    from polyspec.models.verifiers import resolve_verifier

    verifier = resolve_verifier(args.verifier)
    tokenizer = load_tokenizer(verifier.path)
    rows = [json.loads(line) for line in args.train.read_text(encoding="utf-8").splitlines() if line.strip()]
    counts: Counter[int] = Counter()
    for row in track(rows, description="counting en.jsonl tokens"):
        counts.update(count_tokens(tokenizer, [row["prompt"]]))
    turns = mtbench_en_turns()
    counts.update(count_tokens(tokenizer, turns))
    licences = Counter(row["license"] for row in rows)
    table = {
        "verifier": verifier.name,
        "tokenizer_sha256": tokenizer_fingerprint(verifier.path),
        "sources": {
            "train/en.jsonl": {"rows": len(rows), "licenses": dict(sorted(licences.items()))},
            "mtbench/en.jsonl": {"turns": len(turns), "licenses": {"Apache-2.0": len(turns)}},
        },
        "num_tokens": sum(counts.values()),
        "num_distinct": len(counts),
        "counts": {str(i): c for i, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))},
    }
    atomic_write_text(args.out, json.dumps(table, separators=(",", ":")) + "\n")
    print(f"wrote {args.out}: {table['num_tokens']} tokens, {table['num_distinct']} distinct ids, "
          f"{args.out.stat().st_size / 1024:.0f} KB (MT-Bench file: {MTBENCH_EN.name})")


if __name__ == "__main__":
    main()
