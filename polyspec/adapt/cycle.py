"""One adaptation cycle: triggers -> training from traffic -> gate -> canary -> swap or rollback, under the
registry's "adapt" lock, every step an audit event.

Failure rules, whatever happens: nothing is deployed before the gate passed and the candidate's engine is
ready; anything deployed by a cycle that does not finish is withdrawn by it (or, if it died, by the next
cycle, which first withdraws any canary it finds); the step that failed is an ``adapt-failed`` (or
``adapt-training`` interrupted) event with the reason. A training that was interrupted resumes next cycle.
"""

from __future__ import annotations

import errno
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from polyspec.adapt.canary import CANARY_KEY, Ctx, deployment_name, restore, run_canary, swap, withdraw
from polyspec.adapt.engines import ENGINE_KEY, EngineStartFailed
from polyspec.adapt.gate import run_gate
from polyspec.adapt.settings import AdaptSettings
from polyspec.adapt.train import (
    DiskFull, TrainingFailed, TrainingPlan, check_disk, plan_training, register, run_config, run_training,
    serving_deployment,
)
from polyspec.adapt.triggers import Action, Assessment, assess, counters_of
from polyspec.core.errors import ConflictError, NotFoundError
from polyspec.core.settings import get_settings
from polyspec.registry import PromotionRefused
from polyspec.training.pipeline import start_run
from polyspec.training.runs import Run
from polyspec.training.traffic import TrafficDataset, add_replay, build_dataset

LOCK = "adapt"


class NothingToRollBack(NotFoundError):
    """No swap (or canary) of that language to undo."""


class LockKeeper:
    """Renews the adapt lease in a thread every third of its TTL; ``check()`` raises once it was lost."""

    def __init__(self, reg: Any, holder: str, ttl_s: float) -> None:
        self.reg, self.holder, self.ttl_s = reg, holder, ttl_s
        self.lost: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="polyspec-adapt-lock", daemon=True)

    def __enter__(self) -> LockKeeper:
        self.reg.acquire_lock(LOCK, self.holder, self.ttl_s, {"pid": self.holder.split(":")[1]})
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.reg.heartbeat_lock(LOCK, self.holder, self.ttl_s)
            except ConflictError as exc:  # taken over: stop acting
                self.lost = exc
                return
            except Exception:  # noqa: BLE001 - a busy registry: the next beat retries before the lease ends
                continue

    def check(self) -> None:
        if self.lost is not None:
            raise self.lost

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        try:
            self.reg.release_lock(LOCK, self.holder)
        except Exception:  # noqa: BLE001 - an unreleased lease expires by itself
            pass


@dataclass
class CycleResult:
    status: str  # nothing | swapped | rolled-back | gate-failed | interrupted | failed
    language: str | None = None
    attempt: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    assessment: Assessment | None = None

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "language": self.language, "attempt": self.attempt, "details": self.details,
                "assessment": self.assessment.to_json() if self.assessment else None}


def new_attempt(language: str) -> str:
    return f"adapt-{language}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def recover(reg: Any, s: AdaptSettings, who: str, say: Any, check: Any) -> list[dict[str, Any]]:
    """Withdraw canaries that a dead adapt process left deployed (their attempt never ended)."""
    out = []
    for dep in reg.active_deployments():
        canary = (dep.launch or {}).get(CANARY_KEY)
        if not canary or not dep.draft:
            continue
        ctx = Ctx(reg, s, who, str(canary.get("attempt") or "unknown"), str(canary.get("language")), dep.domain,
                  say, check)
        done = withdraw(ctx, reg.get_draft(dep.draft), dep.name, dict((dep.launch or {}).get(ENGINE_KEY) or {}),
                        "canary left by an adapt process that did not finish")
        ctx.event("rollback", "done", **done)
        out.append(done)
    return out


def run_cycle(reg: Any, s: AdaptSettings, *, who: str, say: Any = print, check: Any = lambda: None,
              home: Path | None = None) -> CycleResult:
    """One cycle, the lock already held. Returns what happened; only programming errors escape."""
    home = Path(home or get_settings().home)
    recovered = recover(reg, s, who, say, check)
    assessment = assess(reg, s)
    reg.observe_traffic(counters_of(reg.live_stats()), who=who)
    action = assessment.chosen
    if action is None:
        return CycleResult("nothing", details={"recovered": recovered}, assessment=assessment)
    attempt = str(action.resume["attempt"]) if action.resume else new_attempt(action.language)
    ctx = Ctx(reg, s, who, attempt, action.language, action.domain, say, check, home)
    if not action.resume:
        ctx.event("trigger", "done", triggers=[asdict(t) for t in action.triggers], requests=action.requests,
                  captured=action.captured, new_prompts=action.new_prompts, why=action.why)
    step = "training"
    try:
        candidate, dataset, plan = _train(ctx, action)
        step = "gate"
        gate = _gate(ctx, candidate, dataset, plan)
        if not gate.passed:
            return CycleResult("gate-failed", action.language, attempt, gate.to_json(), assessment)
        step = "canary"
        return CycleResult(*_canary(ctx, candidate), assessment=assessment)
    except TrainingFailed as exc:
        ctx.event("training", "interrupted" if exc.interrupted else "failed", reason=str(exc))
        return CycleResult("interrupted" if exc.interrupted else "failed", action.language, attempt,
                           {"step": step, "reason": str(exc)}, assessment)
    except Exception as exc:  # any other failure: recorded, serving state as it was
        reason = _reason(exc)
        ctx.event("failed", "failed", step=step, reason=reason, error=type(exc).__name__)
        if step == "training":
            ctx.event("training", "failed", reason=reason)
        return CycleResult("failed", action.language, attempt, {"step": step, "reason": reason}, assessment)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full: {exc}"
    return f"{type(exc).__name__}: {exc}"[:2000]


def _train(ctx: Ctx, action: Action) -> tuple[Any, Any, TrainingPlan]:
    reg, s, home = ctx.reg, ctx.s, Path(ctx.home)
    if action.resume:
        dataset = TrafficDataset(**action.resume["dataset"])
        problems = dataset.verify()
        if problems:
            raise TrainingFailed(f"cannot resume {ctx.attempt}: its data set changed ({problems[0]})")
        plan = TrainingPlan(**action.resume["plan"])
        run = Run.open(action.resume["run_id"], home)
        engine_url = action.resume.get("engine_url")
    else:
        check_disk(home, s)
        dataset = build_dataset(s.resolved_capture_dir(), ctx.language, home / "adapt" / ctx.attempt,
                                domain=ctx.domain, seed=s.seed, heldout_fraction=s.heldout_fraction,
                                min_heldout=s.min_heldout, max_heldout=s.max_heldout, max_train=s.max_train_prompts,
                                min_prompts=s.min_train_prompts)
        served = sorted({lang for d in reg.active_deployments() for lang in d.languages} - {ctx.language})
        dataset = add_replay(dataset, s.resolved_capture_dir(), served, s.replay_ratio, seed=s.seed,
                             heldout_fraction=s.heldout_fraction)
        plan = plan_training(reg, ctx.language, ctx.domain, Path(dataset.train_path), measure=True)
        serving = serving_deployment(reg, ctx.language, ctx.domain)
        engine_url = serving.url if s.answers == "engine" and serving is not None and serving.url else None
        verifier = reg.ensure_verifier()
        run = start_run(run_config(ctx.attempt, ctx.language, ctx.domain, dataset, plan, verifier.location,
                                   engine_url, s), home=home)
    about = {"run_id": run.run_id, "dataset": dataset.to_json(), "plan": plan.to_json(), "engine_url": engine_url}
    started = time.time()
    ctx.say(f"training {run.run_id} ({plan.mode}, {dataset.train} prompts, {dataset.heldout} held out)")
    draft_dir = run_training(run, home, home / "logs" / f"{ctx.attempt}-train.log", s,
                             on_start=lambda pid: ctx.event("training", "started", pid=pid, **about), tick=ctx.check)
    verifier_name = reg.ensure_verifier().name
    candidate = register(reg, run, draft_dir, home, ctx.language, ctx.domain, plan, verifier_name, {
        "adapt": {"attempt": ctx.attempt, "dataset": dataset.to_json()}})
    ctx.event("training", "done", **about, draft=candidate.ref, checksums=candidate.checksums,
              seconds=round(time.time() - started, 1))
    return candidate, dataset, plan


def _gate(ctx: Ctx, candidate: Any, dataset: Any, plan: TrainingPlan) -> Any:
    reg = ctx.reg
    serving = serving_deployment(reg, ctx.language, ctx.domain)
    baseline = reg.get_draft(serving.draft) if serving is not None and serving.draft else None
    reference = baseline or (reg.get_draft(plan.parent_ref) if plan.parent_ref else None)
    served = sorted({lang for d in reg.active_deployments() for lang in d.languages})
    ctx.say(f"gate: {candidate.ref} against {baseline.ref if baseline else 'no speculation'}")
    gate = run_gate(reg, candidate, baseline, reference, ctx.language, Path(dataset.heldout_path),
                    dataset.heldout_sha256, served, ctx.s)
    ctx.event("gate", "passed" if gate.passed else "failed", candidate=candidate.ref,
              baseline=baseline.ref if baseline else None, reference=reference.ref if reference else None,
              heldout_sha256=dataset.heldout_sha256, delta=ctx.s.gate_delta, margin=ctx.s.gate_margin,
              **gate.to_json())
    return gate


def _canary(ctx: Ctx, candidate: Any) -> tuple[str, str, str, dict[str, Any]]:
    reference = serving_deployment(ctx.reg, ctx.language, ctx.domain)
    try:
        outcome = run_canary(ctx, candidate, reference)
    except EngineStartFailed as exc:
        ctx.event("failed", "failed", step="canary", reason=str(exc), draft=candidate.ref)
        return "failed", ctx.language, ctx.attempt, {"step": "canary", "reason": str(exc)}
    except BaseException as exc:  # deployed but not decided (lock lost, registry error, Ctrl-C): withdraw
        _withdraw_after(ctx, candidate, exc)
        raise
    if outcome.verdict.decision == "promote":
        try:
            details = swap(ctx, candidate, outcome)
            ctx.event("swap", "done", **details)
            return "swapped", ctx.language, ctx.attempt, details
        except PromotionRefused as exc:
            why = f"the registry refused the promotion: {exc}"
    else:
        why = "; ".join(outcome.verdict.reasons)
    done = withdraw(ctx, candidate, outcome.deployment, outcome.engine, why)
    ctx.event("rollback", "done", candidate=candidate.ref, before=outcome.arms.get("old"),
              after=outcome.arms.get("candidate"), **done)
    return "rolled-back", ctx.language, ctx.attempt, done


def _withdraw_after(ctx: Ctx, candidate: Any, exc: BaseException) -> None:
    name = deployment_name(candidate)
    deps = {d.name: d for d in ctx.reg.active_deployments()}
    engine = dict((deps[name].launch or {}).get(ENGINE_KEY) or {}) if name in deps else {}
    done = withdraw(ctx, candidate, name, engine, f"canary interrupted: {_reason(exc)}")
    ctx.event("rollback", "done", **done)


def rollback_language(reg: Any, s: AdaptSettings, language: str, *, who: str, say: Any = print,
                      check: Any = lambda: None, home: Path | None = None) -> dict[str, Any]:
    """`polyspec adapt rollback LANG`: undo the language's last swap (restore what it replaced, withdraw the
    candidate), or withdraw its canary if one is deployed."""
    home = Path(home or get_settings().home)
    canaries = [d for d in reg.active_deployments() if ((d.launch or {}).get(CANARY_KEY) or {}).get("language") == language]
    if canaries:
        return {"withdrawn": recover(reg, s, who, say, check)}
    swap_event = reg.last_adaptation(language, "swap", status="done")
    if swap_event is None:
        raise NothingToRollBack(f"no swap of {language} to roll back", hint="see `polyspec adapt history`")
    undone = [e for e in reg.adaptation_events(language, steps=["rollback"]) if e.attempt == swap_event.attempt]
    if undone:
        raise NothingToRollBack(f"the last swap of {language} ({swap_event.attempt}) was rolled back already")
    details = swap_event.details
    ctx = Ctx(reg, s, who, swap_event.attempt or "manual", language, details.get("domain", "general"), say, check, home)
    restored = restore(ctx, details)
    deps = {d.name: d for d in reg.deployments(include_stopped=True)}
    dep = deps.get(details["deployment"])
    engine = dict(((dep.launch if dep else None) or {}).get(ENGINE_KEY) or {})
    done = withdraw(ctx, reg.get_draft(details["candidate"]), details["deployment"], engine,
                    "operator rollback (`polyspec adapt rollback`)")
    ctx.event("rollback", "done", manual=True, restored=restored, candidate=details["candidate"], **done)
    return {"restored": restored, **done}


__all__ = ["LOCK", "CycleResult", "DiskFull", "LockKeeper", "NothingToRollBack", "rollback_language", "run_cycle"]
