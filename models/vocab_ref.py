"""An English token-frequency reference for choosing draft vocabularies and measuring coverage.

``models/data/en_token_freq.json`` holds token counts of the bundled verifier's tokenizer over English
prompts (see models/data/README.md; rebuilt by scripts/build_en_token_freq.py). It records the sha256 of
the tokenizer.json it was counted with; any other tokenizer falls back to counting the bundled English
MT-Bench turns on the spot. Tokenization uses the `tokenizers` library directly (no torch).
"""

from __future__ import annotations

from polyspec.core.errors import InvalidInput

import json
from collections import Counter
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from polyspec.models.checksums import sha256_file

DATA_DIR = Path(__file__).resolve().parent / "data"
EN_FREQ_FILE = DATA_DIR / "en_token_freq.json"
MTBENCH_EN = Path(__file__).resolve().parents[1] / "training" / "data" / "mtbench" / "en.jsonl"


class VocabRefError(InvalidInput):
    """The reference cannot be used (no tokenizer, no texts)."""


def load_tokenizer(tokenizer_or_path: Any) -> Any:
    """A tokenizer with ``encode(text)``: a path (model dir or tokenizer.json) or an existing tokenizer object."""
    if not isinstance(tokenizer_or_path, (str, Path)) and not hasattr(tokenizer_or_path, "path"):
        return tokenizer_or_path
    path = Path(getattr(tokenizer_or_path, "path", tokenizer_or_path)).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    if file.is_file() and file.suffix == ".json":
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(file))
    if path.is_dir():
        from transformers import AutoTokenizer  # sentencepiece-only models have no tokenizer.json

        return AutoTokenizer.from_pretrained(str(path))
    raise VocabRefError(f"no tokenizer found at {path}")


def encode_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens, for a `tokenizers.Tokenizer` or a transformers tokenizer."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return list(tokenizer.encode(text, add_special_tokens=False).ids)
    return list(tokenizer.encode(text, add_special_tokens=False))


def count_tokens(tokenizer: Any, texts: Iterable[str]) -> Counter[int]:
    counts: Counter[int] = Counter()
    for text in texts:
        counts.update(encode_ids(tokenizer, text))
    return counts


def mtbench_en_turns(path: Path = MTBENCH_EN) -> list[str]:
    """Every user turn of the bundled English MT-Bench questions."""
    if not path.is_file():
        raise VocabRefError(f"bundled English MT-Bench file missing: {path}")
    turns: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            turns.extend(json.loads(line)["turns"])
    return turns


def tokenizer_fingerprint(verifier_path: str | Path) -> str | None:
    file = Path(verifier_path).expanduser() / "tokenizer.json"
    return sha256_file(file) if file.is_file() else None


def _reference_counts(verifier_path: Path) -> Counter[int]:
    fingerprint = tokenizer_fingerprint(verifier_path)
    if fingerprint and EN_FREQ_FILE.is_file():
        table = json.loads(EN_FREQ_FILE.read_text())
        if table.get("tokenizer_sha256") == fingerprint:
            return Counter({int(k): int(v) for k, v in table["counts"].items()})
    return count_tokens(load_tokenizer(verifier_path), mtbench_en_turns())


def _vocab_and_eos(verifier_path: Path) -> tuple[int | None, list[int]]:
    config = json.loads((verifier_path / "config.json").read_text())
    config = config.get("text_config") or config
    eos = config.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    return config.get("vocab_size"), [int(i) for i in eos_ids]


def english_top_token_ids(verifier_path: str | Path, n: int) -> list[int]:
    """Sorted ids of the ``n`` most frequent verifier tokens in the English reference.

    The end-of-sequence token(s) from config.json always come first: a draft that cannot propose the
    end of an answer loses the last step of every reply. When the reference has fewer than ``n``
    distinct tokens, the lowest unused ids fill up (BPE numbers earlier, i.e. more common, merges lower).
    """
    path = Path(getattr(verifier_path, "path", verifier_path)).expanduser()
    vocab_size, eos_ids = _vocab_and_eos(path)
    if vocab_size is None:
        raise VocabRefError(f"{path}/config.json has no vocab_size")
    if not 0 < n <= vocab_size:
        raise VocabRefError(f"n must lie in [1, {vocab_size}], got {n}")
    counts = _reference_counts(path)
    chosen: list[int] = [i for i in dict.fromkeys(eos_ids) if 0 <= i < vocab_size][:n]
    taken = set(chosen)
    ranked = sorted((i for i in counts if 0 <= i < vocab_size), key=lambda i: (-counts[i], i))
    for i in ranked:
        if len(chosen) >= n:
            break
        if i not in taken:
            chosen.append(i)
            taken.add(i)
    filler = (i for i in range(vocab_size) if i not in taken)
    while len(chosen) < n:
        chosen.append(next(filler))
    return sorted(chosen)


def token_coverage(tokenizer_or_path: Any, texts: Iterable[str], vocab_ids: Collection[int]) -> float:
    """Fraction of the tokens of ``texts`` (verifier tokenizer, no special tokens) whose id is in ``vocab_ids``."""
    tokenizer = load_tokenizer(tokenizer_or_path)
    allowed = set(int(i) for i in vocab_ids)
    total = hit = 0
    for text in texts:
        ids = encode_ids(tokenizer, text)
        total += len(ids)
        hit += sum(1 for i in ids if i in allowed)
    if total == 0:
        raise VocabRefError("the texts hold no tokens; coverage is undefined")
    return hit / total
