"""Training from traffic: the language's captured prompts become a data set (training.traffic), the
registry's language plan picks fine-tune or from-scratch, and the training pipeline runs up to ``fit`` in a
child process (this machine's CPU or GPU), or through ``train_command`` elsewhere. The child can be killed
at any point: the run's stages resume where they stopped (training.runs), so the next cycle continues it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyspec.adapt.settings import AdaptSettings
from polyspec.core.errors import PolyspecError, Unavailable
from polyspec.core.settings import get_settings
from polyspec.registry import NotFound
from polyspec.registry.profiles import PLAN_EXTEND
from polyspec.training.config import RunConfig
from polyspec.training.plan import active_draft
from polyspec.training.registration import durable_copy
from polyspec.training.runs import code_version
from polyspec.training.traffic import free_bytes

FIT_STAGES = ("prompts", "answers", "hidden-states", "vocab", "fit")


class TrainingFailed(PolyspecError):
    """The training child failed, was killed, or timed out. ``interrupted``: it can resume."""

    def __init__(self, message: str, *, interrupted: bool = False, returncode: int | None = None) -> None:
        super().__init__(message)
        self.interrupted, self.returncode = interrupted, returncode


class DiskFull(Unavailable):
    """Less free disk than ``min_free_gib`` under POLYSPEC_HOME, or a write that hit a full disk."""


@dataclass
class TrainingPlan:
    mode: str  # finetune | from-scratch | from-scratch-custom-vocab
    parent_ref: str | None  # registry reference of the parent draft
    parent_location: str | None
    k: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def serving_deployment(reg: Any, language: str, domain: str = "general") -> Any | None:
    """The deployment serving ``language`` now: the speed plan's fastest one, else one whose languages name it,
    else the default."""
    deps = {d.name: d for d in reg.active_deployments()}
    for lp in reg.plan(record=False).languages if deps else []:
        if lp.language == language and lp.best is not None and lp.best.deployment in deps:
            return deps[lp.best.deployment]
    own = [d for d in deps.values() if language in d.languages and d.domain == domain]
    return (own or [d for d in deps.values() if language in d.languages] or
            [d for d in deps.values() if d.is_default] or [None])[0]


def plan_training(reg: Any, language: str, domain: str, train_file: Path | None, *, measure: bool) -> TrainingPlan:
    """Fine-tune the draft that serves the language (or the default language's active draft); from scratch
    when the language's profile says so (another script, low coverage). ``measure`` lets it profile the
    language from ``train_file`` when the registry has no profile (a registry write: not in a dry run)."""
    verifier = get_settings().default_verifier
    try:
        profile = reg.get_language(language, verifier=verifier)
    except NotFound:
        profile = reg.add_language(language, train_file, verifier) if measure and train_file else None
    serving = serving_deployment(reg, language, domain)
    parent = None
    if serving is not None and serving.draft and language in reg.get_draft(serving.draft).languages:
        parent = reg.get_draft(serving.draft)  # the language's own draft: continue from it
    parent = parent or active_draft(reg, verifier)
    scratch = profile is not None and profile.plan != "finetune"
    mode = "from-scratch-custom-vocab" if scratch else ("finetune" if parent is not None else "from-scratch")
    reason = profile.reason if profile is not None else ("no language profile yet: measured from the captured prompts "
                                                        "when the training starts")
    if profile is not None and profile.plan == PLAN_EXTEND:
        reason += (f"; adapt trains a {language} specialist with its own vocabulary from the captured traffic "
                   "instead, as extending the multilingual draft needs prompts of all its languages (polyspec "
                   f"train --plan {language} --prompts FILE...)")
    if parent is None and not scratch:
        reason += "; no active draft to fine-tune: from scratch with the English vocabulary"
    return TrainingPlan(mode, parent.ref if parent else None, parent.location if parent else None,
                        int(parent.k) if parent else 3, reason)


def run_config(run_id: str, language: str, domain: str, dataset: Any, plan: TrainingPlan, verifier: str,
               engine_url: str | None, s: AdaptSettings) -> Any:
    replay = [{"path": dataset.replay_path, "ratio": s.replay_ratio}] if dataset.replay_path and s.replay_ratio else []

    fit = {key: value for key, value in (("epochs", s.epochs), ("lr", s.lr), ("warmup_steps", s.warmup_steps),
                                         ("total_seq_len", s.total_seq_len)) if value is not None}
    return RunConfig.model_validate({
        "run_id": run_id, "language": language, "verifier": verifier, "mode": plan.mode,
        "parent_draft": plan.parent_location, "seed": s.seed, "device": s.device,
        # the held-out live set is apart already: every prompt of the train file trains
        "prompts": {"files": [dataset.train_path], "heldout_fraction": 0.0, "min_heldout": 0,
                    "domain": None if domain == "general" else domain, "replay": replay},
        "answers": {"engine_url": engine_url, "max_new_tokens": s.answer_tokens},
        "fit": fit, "eval": {"k": plan.k}, "registration": {"enabled": False},
    })


def check_disk(home: Path, s: AdaptSettings) -> None:
    free = free_bytes(home) / 1024**3
    if free < s.min_free_gib:
        raise DiskFull(f"only {free:.1f} GiB free under {home}; a training needs {s.min_free_gib:g} GiB "
                       "(POLYSPEC_ADAPT_MIN_FREE_GIB)")


def train_command(run_id: str, home: Path, s: AdaptSettings) -> list[str]:
    if s.train_command:
        return ["/bin/sh", "-c", s.train_command.format(run_id=shlex.quote(run_id), home=shlex.quote(str(home)))]
    return [sys.executable, "-m", "polyspec.cli", "train", "run", "--run-id", run_id, "--resume", "--until", "fit"]


def run_training(run: Any, home: Path, log_path: Path, s: AdaptSettings,
                 on_start: Callable[[int], None] = lambda pid: None, tick: Callable[[], None] = lambda: None) -> Path:
    """Run (or resume) the stages up to fit in a child process; the trained draft's directory."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "POLYSPEC_HOME": str(home), "OMP_WAIT_POLICY": "PASSIVE"}
    with log_path.open("ab") as out:
        proc = subprocess.Popen(train_command(run.run_id, home, s), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    on_start(proc.pid)
    deadline = time.monotonic() + s.train_timeout_s
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TrainingFailed(f"training of run {run.run_id} took over {s.train_timeout_s:.0f} s; stopped "
                                     "(it resumes next cycle)", interrupted=True)
            tick()
            time.sleep(1.0)
    finally:
        if proc.poll() is None:  # a timeout, or this process is being stopped: the child must not outlive it
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if proc.returncode != 0:
        tail = _tail(log_path)
        killed = proc.returncode < 0
        raise TrainingFailed(f"training of run {run.run_id} {'was killed by signal ' + str(-proc.returncode) if killed else f'exited with {proc.returncode}'}"
                             f" (log {log_path}): {tail}", interrupted=True, returncode=proc.returncode)
    if not run.is_done("fit"):
        raise TrainingFailed(f"training of run {run.run_id} ended without a fit stage (log {log_path})")
    return run.stage_dir("fit") / "draft"


def _tail(path: Path, lines: int = 6, chars: int = 800) -> str:
    """The log's last non-blank lines (progress-bar redraws dropped), on one line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [ln.rsplit("\r", 1)[-1].strip() for ln in text.splitlines()]
    return " | ".join([ln for ln in kept if ln][-lines:])[-chars:]


def register(reg: Any, run: Any, draft_dir: Path, home: Path, language: str, domain: str, plan: TrainingPlan,
             verifier: str, provenance: dict[str, Any]) -> Any:
    """Import the trained draft as a candidate (once per run: a re-run after a crash finds it)."""
    for rec in reg.drafts(verifier=verifier, language=language):
        if rec.provenance.get("run_id") == run.run_id:
            return rec
    location = durable_copy(draft_dir, home, run.run_id)
    name = f"adapt-{language}" + ("" if domain == "general" else f"-{domain}")
    summaries = {stage: run.summary(stage) for stage in FIT_STAGES}
    return reg.import_draft(location, verifier=verifier, name=name, languages=[language], domain=domain, k=plan.k,
                            parent=plan.parent_ref, status="candidate", provenance={
                                "run_id": run.run_id, "mode": plan.mode, "seed": run.config.seed,
                                "code_version": code_version(), "recipe": run.config.fit.model_dump(mode="json"),
                                "stages": summaries, "parent": plan.to_json(), **provenance})
