"""Stage 1: read prompt files, keep the target language (and domain), deduplicate, split off held-out prompts.

Prompt files are read by :mod:`polyspec.core.prompts` (the data pack's ``{"id", "prompt", "lang",
"domain"}``, ``turns``, ``text``, OpenAI ``messages``, or plain lines): the same reader as
``registry add-language``, so a file one command accepts the other accepts too.

Language comes from ``core.langid`` — the identifier the router uses — for every record, even where a
``lang`` field exists, so training data and routed traffic agree on what "French" means.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

from rich.table import Table

from polyspec.training.config import PromptsConfig, ReplaySpec
from polyspec.core.domains import detect_domain
from polyspec.core.prompts import NoPrompts, PromptsError, read_prompt_records
from polyspec.training.errors import EmptyPromptFile, NoPromptsForLanguage
from polyspec.core.atomic import atomic_write_json, atomic_write_text
from polyspec.core.langid import detect_many
from polyspec.training.runs import console

_PUNCT_SPACE = re.compile(r"[\W_]+", re.UNICODE)


MULTILINGUAL = "mul"  # ISO 639-2 code for "multiple languages"


def dedup_key(text: str) -> str:
    """NFKC + casefold, whitespace and punctuation dropped: the data pack's own de-duplication key."""
    return _PUNCT_SPACE.sub("", unicodedata.normalize("NFKC", text).casefold())


def read_prompt_file(path: Path) -> list[dict[str, Any]]:
    """Normalised records: id, messages, text (user turns joined), label_lang, domain, source_file.

    Any format :mod:`polyspec.core.prompts` reads (prompt, turns, text, messages or plain lines).
    """
    path = Path(path)
    try:
        records = read_prompt_records(path)
    except NoPrompts:
        raise EmptyPromptFile(f"prompt file {path} holds no prompts") from None
    return [{
        "id": rec.id,
        "messages": [dict(m) for m in rec.messages],
        "text": rec.text,
        "label_lang": rec.lang,
        "domain": rec.domain,
        "source_file": path.name,
    } for rec in records]


def _annotate(records: list[dict[str, Any]]) -> None:
    """Add detected language (+confidence) and fill missing domains."""
    guesses = detect_many([r["text"] for r in records])
    for rec, guess in zip(records, guesses, strict=True):
        rec["lang"], rec["lang_confidence"] = guess.language, round(float(guess.confidence), 4)
        if not rec["domain"]:
            rec["domain"] = detect_domain(rec["text"])
            rec["domain_detected"] = True


def _dedupe(records: list[dict[str, Any]], seen: set[str]) -> list[dict[str, Any]]:
    kept = []
    for rec in records:
        key = dedup_key(rec["text"])
        if key and key not in seen:
            seen.add(key)
            kept.append(rec)
    return kept


def _filter(records: list[dict[str, Any]], language: str, cfg: PromptsConfig) -> list[dict[str, Any]]:
    found = Counter(r["lang"] for r in records)
    if language == MULTILINGUAL:  # a domain draft serves every language: keep them all
        kept = list(records)
    else:
        kept = [r for r in records if r["lang"] == language and r["lang_confidence"] >= cfg.min_langid_confidence]
    if not kept:
        langs = ", ".join(f"{lang} ({n})" for lang, n in found.most_common(8))
        raise NoPromptsForLanguage(
            f"no {language!r} prompts left after language filtering; languages found: {langs or 'none'}"
        )
    if cfg.domain:
        in_domain = [r for r in kept if r["domain"] == cfg.domain]
        if not in_domain:
            domains = ", ".join(f"{d} ({n})" for d, n in Counter(r["domain"] for r in kept).most_common())
            raise NoPromptsForLanguage(f"no {language!r} prompts of domain {cfg.domain!r}; domains found: {domains}")
        kept = in_domain
    return kept


def split_heldout(records: list[dict[str, Any]], cfg: PromptsConfig, seed: int) -> tuple[list, list]:
    """Seeded shuffle, then the first n go to held-out (at least one prompt stays for training)."""
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)
    n_held = round(len(shuffled) * cfg.heldout_fraction)
    n_held = max(cfg.min_heldout, min(cfg.max_heldout, n_held))
    n_held = min(n_held, len(shuffled) - 1)
    heldout, train = shuffled[:n_held], shuffled[n_held:]
    if cfg.max_prompts is not None:
        train = train[: cfg.max_prompts]
    return train, heldout


def _replay(spec: ReplaySpec, n_train: int, seen: set[str], seed: int) -> list[dict[str, Any]]:
    records = _dedupe(read_prompt_file(spec.path), seen)
    _annotate(records)
    want = max(1, round(spec.ratio * n_train))
    random.Random(seed + 1).shuffle(records)
    if len(records) < want:
        console.print(f"[yellow]replay {spec.path.name}: only {len(records)} prompts for the {want} asked")
    picked = records[:want]
    for rec in picked:
        rec["replay"] = True
    return picked


def build_prompts(out_dir: Path, language: str, cfg: PromptsConfig, seed: int) -> dict[str, Any]:
    """Write train.jsonl / heldout.jsonl / stats.json under ``out_dir``; returns the stats."""
    if not cfg.files:
        raise PromptsError("no prompt file given (--prompts FILE)")
    records: list[dict[str, Any]] = []
    for path in cfg.files:
        records.extend(read_prompt_file(path))
    seen: set[str] = set()
    unique = _dedupe(records, seen)
    _annotate(unique)
    kept = _filter(unique, language, cfg)
    train, heldout = split_heldout(kept, cfg, seed)
    seen = {dedup_key(r["text"]) for r in kept}
    replay = [r for spec in cfg.replay for r in _replay(spec, len(train), seen, seed)]
    _write_jsonl(out_dir / "train.jsonl", train + replay)
    _write_jsonl(out_dir / "heldout.jsonl", heldout)
    stats = {
        "read": len(records),
        "duplicates": len(records) - len(unique),
        "languages_found": dict(Counter(r["lang"] for r in unique).most_common()),
        "kept": len(kept),
        "train": len(train),
        "heldout": len(heldout),
        "replay": dict(Counter(r["lang"] for r in replay)),
        "domains": dict(Counter(r["domain"] for r in train + heldout)),
    }
    atomic_write_json(out_dir / "stats.json", stats)
    _print_stats(language, stats)
    return stats


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _print_stats(language: str, stats: dict[str, Any]) -> None:
    table = Table(title=f"prompts ({language})")
    for col in ("read", "duplicates", "kept", "train", "heldout"):
        table.add_column(col, justify="right")
    table.add_column("languages found")
    langs = ", ".join(f"{k}:{v}" for k, v in list(stats["languages_found"].items())[:6])
    table.add_row(*(str(stats[c]) for c in ("read", "duplicates", "kept", "train", "heldout")), langs)
    console.print(table)
