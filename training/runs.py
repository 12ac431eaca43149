"""Run directories, stage markers and provenance.

Layout: ``$POLYSPEC_HOME/runs/RUN_ID/run.json`` (the RunConfig) and one directory per stage. A stage is
done when its directory holds ``DONE.json``, written last and atomically; it records the sizes and
sha256 of the stage's outputs and of the inputs it read, so a re-run can skip it after checking it, and
redo it when an earlier stage was redone (its inputs changed).
"""

from __future__ import annotations

from polyspec import __version__
from polyspec.core.settings import get_settings

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from polyspec.core.atomic import atomic_write_json
from polyspec.models.checksums import sha256_file
from polyspec.training.config import STAGES, RunConfig
from polyspec.training.errors import RunConfigMismatch, RunExists, RunNotFound, StageCorrupt, StageMissing

console = Console(stderr=True)
MARKER = "DONE.json"
# Files above this size are checked by size only on a re-run; hashing gigabytes of hidden states on
# every resume would cost more than the check is worth. Their sha256 is still recorded in the marker.
FULL_VERIFY_LIMIT = 32 * 1024 * 1024


def runs_root(home: Path | None = None) -> Path:
    return (Path(home).expanduser() if home else get_settings().home) / "runs"


def code_version() -> str:
    """polyspec.__version__ plus the git commit of the source tree when there is one (+dirty marker)."""
    repo = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    if not sha:
        return __version__
    return f"{__version__}+g{sha}{'.dirty' if dirty else ''}"


def file_record(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def tree_records(root: Path) -> dict[str, dict[str, Any]]:
    """relative path -> {size, sha256} for every file under a stage dir, the marker excluded."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != MARKER and not path.name.startswith("."):
            out[rel] = file_record(path)
    return out


def check_records(root: Path, records: dict[str, dict[str, Any]]) -> list[str]:
    """Problems between the files under ``root`` and their recorded size/sha256 (empty = fine)."""
    problems = []
    for rel, rec in records.items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
        elif path.stat().st_size != rec["size"]:
            problems.append(f"{rel}: size {path.stat().st_size} != recorded {rec['size']}")
        elif rec["size"] <= FULL_VERIFY_LIMIT and sha256_file(path) != rec["sha256"]:
            problems.append(f"{rel}: sha256 differs from the recorded one")
    return problems


@dataclass
class Run:
    """One training run on disk."""

    root: Path
    config: RunConfig

    @property
    def run_id(self) -> str:
        return self.config.run_id

    @classmethod
    def create(cls, config: RunConfig, home: Path | None = None, exist_ok: bool = False) -> Run:
        """Make the run directory and save run.json; an existing run must hold the same config."""
        root = runs_root(home) / config.run_id
        if (root / "run.json").exists():
            if not exist_ok:
                raise RunExists(f"run {config.run_id!r} already exists at {root}; pass --resume to continue it")
            existing = cls.open(config.run_id, home)
            _ensure_same(existing.config, config)
            return existing
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_json(root / "run.json", config.model_dump(mode="json"))
        return cls(root=root, config=config)

    @classmethod
    def open(cls, run_id: str, home: Path | None = None) -> Run:
        root = runs_root(home) / run_id
        if not (root / "run.json").is_file():
            known = sorted(p.name for p in root.parent.glob("*") if (p / "run.json").is_file()) if root.parent.is_dir() else []
            hint = f" Known runs: {', '.join(known[-5:])}" if known else ""
            raise RunNotFound(f"no run {run_id!r} under {root.parent}.{hint}")
        config = RunConfig.model_validate_json((root / "run.json").read_text(encoding="utf-8"))
        return cls(root=root, config=config)

    def stage_dir(self, stage: str) -> Path:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        return self.root / stage

    def marker(self, stage: str) -> dict[str, Any] | None:
        path = self.stage_dir(stage) / MARKER
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def is_done(self, stage: str) -> bool:
        return self.marker(stage) is not None

    def require(self, stage: str) -> Path:
        """The output dir of an earlier stage, which must be done."""
        if not self.is_done(stage):
            raise StageMissing(f"stage {stage!r} of run {self.run_id!r} has not finished; run it first")
        return self.stage_dir(stage)

    def summary(self, stage: str) -> dict[str, Any]:
        marker = self.marker(stage)
        return marker.get("summary", {}) if marker else {}

    def status(self) -> list[dict[str, Any]]:
        rows = []
        for stage in STAGES:
            marker = self.marker(stage)
            started = self.stage_dir(stage).is_dir()
            rows.append({
                "stage": stage,
                "state": "done" if marker else ("partial" if started else "pending"),
                "seconds": marker.get("seconds") if marker else None,
                "finished_at": marker.get("finished_at") if marker else None,
            })
        return rows


def _ensure_same(saved: RunConfig, wanted: RunConfig) -> None:
    a, b = saved.model_dump(mode="json"), wanted.model_dump(mode="json")
    diffs = sorted(_diff(a, b))
    if diffs:
        raise RunConfigMismatch(
            f"run {saved.run_id!r} was made with other settings ({'; '.join(diffs[:6])}); "
            "resume it without changing knobs, or start a new run id"
        )


def _diff(a: Any, b: Any, prefix: str = "") -> Iterable[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            yield from _diff(a.get(key), b.get(key), f"{prefix}{key}.")
    elif a != b:
        yield f"{prefix.rstrip('.')}: {a!r} -> {b!r}"


def input_records(paths: Iterable[Path], root: Path | None = None) -> dict[str, dict[str, Any]]:
    """Stage inputs (earlier stages' markers, prompt files): files inside the run keyed relative to it
    (a moved run stays valid), others by absolute path."""
    out = {}
    for p in paths:
        path = Path(p).resolve()
        key = path.relative_to(root.resolve()).as_posix() if root and path.is_relative_to(root.resolve()) else str(path)
        out[key] = file_record(path)
    return out


def run_stage(
    run: Run,
    stage: str,
    body: Callable[[Path], dict[str, Any]],
    inputs: Iterable[Path] = (),
    resumable: bool = False,
) -> dict[str, Any]:
    """Run one stage unless it is done and intact; returns the stage summary.

    ``body(out_dir)`` writes the outputs and returns a JSON-able summary. Non-resumable stages start
    from an empty directory; resumable ones (answers, hidden states, fit) keep what they find.
    """
    out = run.stage_dir(stage)
    inputs = [Path(p) for p in inputs]
    marker = run.marker(stage)
    if marker is not None:
        if marker.get("inputs") == input_records(inputs, run.root):
            problems = check_records(out, marker.get("outputs", {}))
            if problems:
                raise StageCorrupt(
                    f"stage {stage!r} of run {run.run_id!r} is marked done but {problems[0]}"
                    f"{f' (+{len(problems) - 1} more)' if len(problems) > 1 else ''}; "
                    f"redo it with --redo {stage}"
                )
            console.print(f"[green]✓[/] {stage}: done earlier, outputs verified — skipped")
            return marker.get("summary", {})
        console.print(f"[yellow]↻[/] {stage}: an earlier stage changed since it ran — redoing")
        resumable = False
    if out.exists() and not resumable:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    console.rule(f"[bold]{stage}")
    started = time.time()
    summary = body(out)
    record = {
        "stage": stage,
        "run_id": run.run_id,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 2),
        "code_version": code_version(),
        "seed": run.config.seed,
        "inputs": input_records(inputs, run.root),
        "outputs": tree_records(out),
        "summary": summary,
    }
    atomic_write_json(out / MARKER, record)
    return summary


def redo(run: Run, stage: str) -> None:
    """Forget a stage's result; later stages then see changed inputs and redo themselves as well."""
    shutil.rmtree(run.stage_dir(stage), ignore_errors=True)


# The knobs each reusable stage's output depends on (cumulative: a stage also needs the earlier ones).
_STAGE_KNOBS = {"prompts": ("language", "seed", "prompts", "mix"), "answers": ("verifier", "answers"),
               "hidden-states": ("hidden",)}


def reuse_stages(run: Run, source: Run, stages: Iterable[str] = ("prompts", "answers", "hidden-states")) -> list[str]:
    """Copy done stages of ``source`` into ``run`` (hard links, so no extra disk) when every knob that
    shaped them is equal: a from-scratch and a fine-tune run then share one set of answers.

    Returns the stages reused; raises RunConfigMismatch naming the first differing knob.
    """
    wanted = [s for s in STAGES if s in set(stages)]
    if wanted != list(STAGES[: len(wanted)]):
        raise ValueError(f"reuse needs a prefix of {STAGES[:3]}, got {wanted}")
    a, b = _data_view(source.config), _data_view(run.config)
    reused = []
    for stage in wanted:
        if stage not in _STAGE_KNOBS:
            raise ValueError(f"stage {stage!r} cannot be reused (its output depends on the draft)")
        diffs = [d for knob in _STAGE_KNOBS[stage] for d in _diff(a.get(knob), b.get(knob), f"{knob}.")]
        if diffs:
            raise RunConfigMismatch(f"cannot reuse {stage!r} of run {source.run_id!r}: {diffs[0]}")
        src = source.require(stage)
        dst = run.stage_dir(stage)
        if run.is_done(stage):
            reused.append(stage)
            continue
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, copy_function=_link_or_copy)
        reused.append(stage)
    return reused


def _data_view(config: RunConfig) -> dict[str, Any]:
    """The config as the data stages see it: a mixture's coverage target shapes only the vocabulary."""
    tree = config.model_dump(mode="json")
    if tree.get("mix"):
        tree["mix"] = {k: v for k, v in tree["mix"].items() if k != "coverage_target"}
    return tree


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)

