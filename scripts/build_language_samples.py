"""Rebuild registry/data/samples/{lang}.jsonl: a small text sample per language for `registry add-language`.

Each sample is the first SENTENCES NTREX-128 news sentences of that language in the data pack
(../shared/data/train/more/{lang}.jsonl.gz): one professional translation of the same English news set in
every language, so the languages' vocabulary coverage is compared on the same content. Records keep their
`source` (owner/repo@commit:path) and `license`. Usage:
    .venv/bin/python scripts/build_language_samples.py [--pack PATH] [--sentences N]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polyspec.core.atomic import atomic_write_text  # noqa: E402
from polyspec.registry.samples import SAMPLES_DIR  # noqa: E402

SOURCE = "MicrosoftTranslator/NTREX@"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack", type=Path, default=ROOT.parent / "shared" / "data" / "train" / "more")
    parser.add_argument("--sentences", type=int, default=120)
    args = parser.parse_args()
    for path in sorted(args.pack.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        keep = [{k: r[k] for k in ("id", "lang", "prompt", "source", "license")}
                for r in rows if r["source"].startswith(SOURCE)][: args.sentences]
        if len(keep) < args.sentences:
            raise SystemExit(f"{path}: only {len(keep)} NTREX sentences")
        lang = keep[0]["lang"]
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep)
        atomic_write_text(SAMPLES_DIR / f"{lang}.jsonl", text)
        print(f"{lang}: {len(keep)} sentences, {len(text.encode())} bytes")


if __name__ == "__main__":
    main()
