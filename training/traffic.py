"""Captured traffic as training data: the router's capture files (router.capture) of one language become a
train file and a held-out live file.

- **Split.** Each prompt goes to held-out when a hash of (seed, its de-duplication key) falls below the
  held-out fraction: the same prompt lands on the same side in every later data set, so a prompt held out
  once never trains afterwards, however the capture grows. Caps (``max_heldout``) drop the surplus of
  held-out prompts rather than moving them to train, for the same reason.
- **Watermarks.** What a data set consumed is recorded per capture file as (inode, bytes of whole lines):
  rotation renames a file but keeps its inode, so "new prompts since the last draft" counts the lines past
  each file's mark, and whole files it has never seen.
- **Bad input.** Capture files are written by routers from client text: a torn last line, a record that
  is not an object, a missing or oversized prompt, or a language field that disagrees are skipped and
  counted, never fatal. Only prompt files are read; the answers come from the verifier later.

Both files are in the training prompt schema (``{"id", "lang", "domain", "prompt"}``), so the pipeline
(``prompts.files``) and `polyspec eval` (a benchmark file) read them as they are.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from polyspec.core.atomic import atomic_path
from polyspec.training.errors import TrainingError
from polyspec.training.prompts import dedup_key

MAX_PROMPT_CHARS = 32_000  # the router's capture_max_prompt_chars default: longer lines are not its records
_ROTATED = re.compile(r"^(?P<lang>[a-z]{2,3}(-[a-z0-9]{1,8})?)-\d{8}T\d{6}\.\d{6}Z\.jsonl$")


class TrafficDataError(TrainingError):
    """Captured prompts that cannot make a data set (too few, unreadable directory)."""


def capture_files(directory: Path, language: str) -> list[Path]:
    """The language's rotated files (oldest first: their names sort by time), then its active file."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    rotated = sorted(p for p in directory.iterdir()
                     if p.is_file() and (m := _ROTATED.match(p.name)) and m.group("lang") == language)
    active = directory / f"{language}.jsonl"
    return rotated + ([active] if active.is_file() else [])


def _whole_bytes(path: Path) -> int:
    """Bytes up to the last newline: a line a router is writing right now is not consumed yet."""
    with path.open("rb") as fh:
        data = fh.read()
    return data.rfind(b"\n") + 1


def file_marks(directory: Path, language: str) -> dict[str, dict[str, Any]]:
    """inode -> {name, bytes}: how far each capture file of the language is consumed now."""
    return {str(p.stat().st_ino): {"name": p.name, "bytes": _whole_bytes(p)} for p in capture_files(directory, language)}


def _lines(path: Path, start: int = 0) -> Iterator[bytes]:
    with path.open("rb") as fh:
        fh.seek(start)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    yield from (line for line in data[:end].split(b"\n") if line.strip())


def count_new(directory: Path, language: str, marks: dict[str, Any] | None = None) -> int:
    """Captured lines of the language past the watermarks (every line when there are none). A file whose
    inode has a mark is read from the mark on; one smaller than its mark is a new file on a reused inode."""
    marks = marks or {}
    total = 0
    for path in capture_files(directory, language):
        start = int((marks.get(str(path.stat().st_ino)) or {}).get("bytes", 0))
        total += sum(1 for _ in _lines(path, start if start <= path.stat().st_size else 0))
    return total


def read_captured(directory: Path, language: str, domain: str | None = None) -> tuple[list[dict[str, Any]], Counter]:
    """(records, skipped by reason): the language's captured prompts, deduplicated, oldest first."""
    skipped: Counter[str] = Counter()
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for path in capture_files(directory, language):
        for raw in _lines(path):
            rec = _record(raw, language, skipped)
            if rec is None or (domain not in (None, "general") and rec["domain"] != domain):
                continue
            key = dedup_key(rec["prompt"])
            if not key or key in seen:
                skipped["duplicate" if key else "empty"] += 1
                continue
            seen.add(key)
            out.append(rec)
    return out, skipped


def _record(raw: bytes, language: str, skipped: Counter) -> dict[str, Any] | None:
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        skipped["malformed"] += 1
        return None
    prompt = obj.get("prompt") if isinstance(obj, dict) else None
    if not isinstance(prompt, str) or not prompt.strip():
        skipped["no_prompt"] += 1
        return None
    if len(prompt) > MAX_PROMPT_CHARS:
        skipped["too_long"] += 1
        return None
    if obj.get("lang") not in (None, language):
        skipped["other_language"] += 1
        return None
    domain = obj.get("domain") if isinstance(obj.get("domain"), str) and obj.get("domain") else "general"
    rid = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else None
    text = prompt.strip()
    return {"id": rid or f"capture-{language}-{hashlib.sha256(text.encode()).hexdigest()[:16]}",
            "lang": language, "domain": domain[:64], "prompt": text}


def heldout_score(seed: int, text: str) -> float:
    """Uniform in [0, 1) per (seed, prompt): below the held-out fraction means held out, for good."""
    digest = hashlib.sha256(f"{seed}\x00{dedup_key(text)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split(records: list[dict[str, Any]], *, seed: int, heldout_fraction: float, min_heldout: int,
          max_heldout: int, max_train: int | None = None) -> tuple[list[dict], list[dict], int]:
    """(train, held-out, dropped). Held-out: the prompts whose score is below the fraction, topped up to
    ``min_heldout`` with the next lowest scores, capped at ``max_heldout`` (the surplus is dropped, never
    trained on). Train: the rest, the newest first when ``max_train`` cuts it."""
    scored = sorted(records, key=lambda r: heldout_score(seed, r["prompt"]))
    n_held = sum(1 for r in scored if heldout_score(seed, r["prompt"]) < heldout_fraction)
    want = min(max(n_held, min_heldout), max_heldout)
    heldout = scored[:want]
    dropped = max(0, n_held - want)
    held_ids = {r["id"] for r in scored[:max(n_held, want)]}
    train = [r for r in records if r["id"] not in held_ids]
    if max_train is not None and len(train) > max_train:
        dropped += len(train) - max_train
        train = train[-max_train:]
    return train, heldout, dropped


def _write(path: Path, data: bytes) -> None:
    """Write a file atomically (the one write of this module; tests replace it to inject a full disk)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


@dataclass
class TrafficDataset:
    language: str
    domain: str
    train_path: str
    heldout_path: str
    train_sha256: str
    heldout_sha256: str
    train: int
    heldout: int
    dropped: int
    skipped: dict[str, int] = field(default_factory=dict)
    marks: dict[str, Any] = field(default_factory=dict)  # capture watermarks this data set consumed
    replay_path: str | None = None  # other languages' captured prompts mixed in, so they are not forgotten
    replay_sha256: str | None = None
    replay: dict[str, int] = field(default_factory=dict)  # language -> prompts

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def verify(self) -> list[str]:
        """Problems with the files on disk (empty: both still hold what was recorded)."""
        problems = []
        files = [(self.train_path, self.train_sha256), (self.heldout_path, self.heldout_sha256)]
        for path, digest in files + ([(self.replay_path, self.replay_sha256)] if self.replay_path else []):
            p = Path(path)
            if not p.is_file():
                problems.append(f"{path}: missing")
            elif hashlib.sha256(p.read_bytes()).hexdigest() != digest:
                problems.append(f"{path}: sha256 differs from the recorded one")
        return problems


def build_dataset(directory: Path, language: str, out_dir: Path, *, domain: str = "general", seed: int = 0,
                  heldout_fraction: float = 0.1, min_heldout: int = 8, max_heldout: int = 200,
                  max_train: int | None = None, min_prompts: int = 2) -> TrafficDataset:
    """Write ``train.jsonl`` and ``heldout.jsonl`` under ``out_dir`` from the language's captured prompts."""
    marks = file_marks(directory, language)  # before reading: lines written meanwhile count as new next time
    records, skipped = read_captured(directory, language, domain)
    if len(records) < min_prompts:
        raise TrafficDataError(f"{len(records)} usable captured {language} prompts"
                               f"{'' if domain in (None, 'general') else f' of domain {domain}'} in {directory}; "
                               f"a training needs {min_prompts}" + (f" (skipped: {dict(skipped)})" if skipped else ""))
    train, heldout, dropped = split(records, seed=seed, heldout_fraction=heldout_fraction, min_heldout=min_heldout,
                                    max_heldout=max_heldout, max_train=max_train)
    if not train:
        raise TrafficDataError(f"all {len(records)} captured {language} prompts went to the held-out set")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"train": _jsonl(train), "heldout": _jsonl(heldout)}
    for name, data in files.items():
        _write(out_dir / f"{name}.jsonl", data)
    return TrafficDataset(
        language=language, domain=domain or "general", train_path=str(out_dir / "train.jsonl"),
        heldout_path=str(out_dir / "heldout.jsonl"), train_sha256=hashlib.sha256(files["train"]).hexdigest(),
        heldout_sha256=hashlib.sha256(files["heldout"]).hexdigest(), train=len(train), heldout=len(heldout),
        dropped=dropped, skipped=dict(skipped), marks=marks)


def add_replay(dataset: TrafficDataset, directory: Path, languages: list[str], ratio: float, *, seed: int = 0,
               heldout_fraction: float = 0.1) -> TrafficDataset:
    """Mix ``ratio`` prompts per training prompt from other languages' captures into the data set (fine-tuning on
    one language alone makes a draft forget the others, which the gate would then refuse). Their own held-out
    prompts (the same hash split) stay out, so no language's held-out set ever trains."""
    want = math.ceil(ratio * dataset.train)
    pools = {}
    for lang in languages:
        records, _ = read_captured(directory, lang)
        pools[lang] = [r for r in records if heldout_score(seed, r["prompt"]) >= heldout_fraction]
    total = sum(len(p) for p in pools.values())
    if want <= 0 or total == 0:
        return dataset
    picked: list[dict[str, Any]] = []
    for _, records in sorted(pools.items()):  # each language in proportion to what was captured of it
        share = math.ceil(want * len(records) / total)
        picked += sorted(records, key=lambda r: heldout_score(seed + 1, r["prompt"]))[:share]
    picked = picked[:want]
    data = _jsonl(picked)
    path = Path(dataset.train_path).with_name("replay.jsonl")
    _write(path, data)
    dataset.replay_path, dataset.replay_sha256 = str(path), hashlib.sha256(data).hexdigest()
    dataset.replay = dict(Counter(r["lang"] for r in picked))
    return dataset


def free_bytes(path: Path) -> int:
    """Free bytes on the file system holding ``path`` (its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
