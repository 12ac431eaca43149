"""Canary, swap and rollback (blue-green): the candidate's engine starts beside the old one, is deployed as a
canary for its language (``launch.canary.share`` of that language's traffic, router.decision.canary), is compared
live with the old engine (polyspec.adapt.stats), then either promoted (the old deployments of the language
are undeployed, drained and stopped) or withdrawn (undeployed, drained, stopped, the candidate retired).

Order matters for zero failed requests: a new engine is deployed only once ready (and self-checked); an old
one is stopped only after the routers stopped sending to it (refreshed, or their refresh period waited)
and its last request ended (drained). A request that races the change anyway fails over to another
replica in the router (``max_attempts``) before any byte reached the client.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from polyspec.adapt.engines import (
    ENGINE_KEY, alive, candidate_spec, drain, engine_record, owned_pid, refresh_routers, start_engine, stop_pid,
)
from polyspec.adapt.gate import gain_benchmarks
from polyspec.adapt.settings import AdaptSettings
from polyspec.adapt.stats import Arm, Verdict, verdict
from polyspec.engines import calibrate_deployments
from polyspec.registry import NotFound, RegistryError
from polyspec.router.decision.canary import CANARY_KEY  # in Deployment.launch: {"language", "share", "attempt"}

# launch keys a redeployed engine keeps (the rest described an engine that no longer runs)
ENGINE_KNOBS = ("k", "max_model_len", "kv_cache_gib", "dtype", "cpu_bind", "threads", "served_model_name",
                "extra_args", "env")


@dataclass
class Ctx:
    """One adaptation attempt: where events go, who acts, and how to check that the lock is still ours."""

    reg: Any
    s: AdaptSettings
    who: str
    attempt: str
    language: str
    domain: str
    say: Callable[[str], None] = print
    check: Callable[[], None] = lambda: None
    home: Path = Path(".")

    def event(self, step: str, status: str = "done", /, **details: Any) -> Any:
        return self.reg.record_adaptation(step, self.language, who=self.who, attempt=self.attempt, status=status,
                                          domain=self.domain, **details)

    def refresh(self) -> list[dict[str, Any]]:
        return refresh_routers(self.s.router_urls, self.s.router_refresh_s)


@dataclass
class CanaryOutcome:
    deployment: str
    engine: dict[str, Any]
    verdict: Verdict
    arms: dict[str, Any] = field(default_factory=dict)


def deployment_name(candidate: Any) -> str:
    return f"adapt-{candidate.name}-v{candidate.version}"[:200]


def per_draft(stats: list[Any], language: str, domain: str) -> dict[str, dict[str, Any]]:
    """Live counters of one language (one domain, unless general) per draft, summed over routers."""
    out: dict[str, dict[str, Any]] = {}
    for row in stats:
        if row.language != language or (domain != "general" and row.domain != domain):
            continue
        acc = out.setdefault(row.draft_name, {"r": 0, "t": 0, "s": 0.0, "n": 0, "p": []})
        acc["r"] += row.requests
        acc["t"] += row.completion_tokens
        acc["s"] += row.generation_s
        acc["n"] += row.num_spec_steps
        width = max(len(acc["p"]), len(row.accepted_per_pos))
        acc["p"] = [(acc["p"][i] if i < len(acc["p"]) else 0) + (row.accepted_per_pos[i] if i < len(row.accepted_per_pos)
                                                                  else 0) for i in range(width)]
    return out


def _minus(now: dict[str, Any], then: dict[str, Any] | None) -> dict[str, Any]:
    then = then or {"r": 0, "t": 0, "s": 0.0, "n": 0, "p": []}
    width = len(now["p"])
    return {"r": now["r"] - then["r"], "t": now["t"] - then["t"], "s": now["s"] - then["s"], "n": now["n"] - then["n"],
            "p": [now["p"][i] - (then["p"][i] if i < len(then["p"]) else 0) for i in range(width)]}


def arms(start: dict[str, dict], now: dict[str, dict], candidate: str, windows: dict[str, list]) -> tuple[Arm, Arm]:
    """(candidate, old) over the canary: old = every other draft's traffic of the language for tokens/s, and the
    busiest other draft (the one the candidate competes with) for acceptance."""
    delta = {d: _minus(acc, start.get(d)) for d, acc in now.items()}
    c = delta.get(candidate) or {"r": 0, "t": 0, "s": 0.0, "n": 0, "p": []}
    others = {d: acc for d, acc in delta.items() if d != candidate and acc["r"] > 0}
    busiest = max(others, key=lambda d: others[d]["r"], default="none")
    inc = others.get(busiest) or {"n": 0, "p": []}
    cand = Arm("candidate", c["r"], c["t"], c["s"], c["n"], c["p"], True, windows.get("candidate", []))
    old = Arm(f"old ({busiest})", sum(a["r"] for a in others.values()), sum(a["t"] for a in others.values()),
              sum(a["s"] for a in others.values()), inc["n"], inc["p"], busiest != "none", windows.get("old", []))
    return cand, old


def _healthy(url: str, pid: int | None) -> bool:
    if pid is not None and not alive(pid):
        return False
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Watch:
    """Live counters of the language from the moment the canary starts: the old engine's traffic while the
    candidate's engine loads is part of its arm (the same hours, the same load), the candidate's begins when
    it is deployed."""

    ctx: Ctx
    candidate: str
    start: dict[str, dict] = field(default_factory=dict)
    prev: dict[str, dict] = field(default_factory=dict)
    windows: dict[str, list] = field(default_factory=lambda: {"candidate": [], "old": []})

    def __post_init__(self) -> None:
        self.start = self.prev = per_draft(self.ctx.reg.live_stats(), self.ctx.language, self.ctx.domain)

    def poll(self) -> tuple[Arm, Arm]:
        """One poll: the new traffic since the last one becomes a window of each arm that had some."""
        now = per_draft(self.ctx.reg.live_stats(), self.ctx.language, self.ctx.domain)
        step_c, step_o = arms(self.prev, now, self.candidate, {})
        for name, arm in (("candidate", step_c), ("old", step_o)):
            if arm.requests > 0 and arm.generation_s > 0:
                self.windows[name].append((arm.completion_tokens, arm.generation_s))
        self.prev = now
        return arms(self.start, now, self.candidate, self.windows)


def monitor(ctx: Ctx, watch: Watch, url: str, pid: int | None) -> tuple[Verdict, Arm, Arm]:
    """Poll until the verdict is promote or rollback (the canary engine dying is a rollback)."""
    s = ctx.s
    deadline, misses = time.monotonic() + s.canary_timeout_s, 0
    while True:
        ctx.check()
        time.sleep(s.canary_poll_s)
        cand, old = watch.poll()
        # Health after the figures: requests cut short by a dying engine must not be judged as the draft's
        # acceptance (a killed engine's last requests report no accepted tokens).
        misses = 0 if _healthy(url, pid) else misses + 1
        if misses >= 2:
            return Verdict("rollback", [f"the canary engine at {url} stopped answering /health"], []), cand, old
        if misses:
            ctx.say(f"canary: the engine at {url} did not answer /health; figures not judged this poll")
            continue
        result = verdict(cand, old, alpha=s.canary_alpha, min_requests=s.canary_min_requests,
                         final=time.monotonic() > deadline)
        ctx.say(f"canary: candidate {cand.requests} requests, old {old.requests}: {result.decision}")
        if result.decision != "wait":
            return result, cand, old


def _start_watching(ctx: Ctx, watch: Watch, spec: dict[str, Any], log_path: Path) -> Any:
    """Start the engine in a thread while the old engine's traffic is measured; the engine, or its error."""
    box: dict[str, Any] = {}

    def start() -> None:
        try:
            box["engine"] = start_engine(spec, log_path, timeout_s=ctx.s.engine_ready_timeout_s,
                                         self_check=ctx.s.self_check)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=start, name="polyspec-adapt-engine", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(ctx.s.canary_poll_s)
        watch.poll()
        try:
            ctx.check()
        except Exception:
            thread.join()  # the engine start ends (ready or failed) before anything is withdrawn
            if "engine" in box:
                box["engine"].stop()
            raise
    if "error" in box:
        raise box["error"]
    return box["engine"]


def run_canary(ctx: Ctx, candidate: Any, reference: Any) -> CanaryOutcome:
    """Start the candidate's engine, deploy it as a canary, compare it live; the outcome (nothing withdrawn yet)."""
    reg, s = ctx.reg, ctx.s
    verifier = reg.get_verifier(candidate.verifier).location
    spec = candidate_spec(getattr(reference, "launch", None), verifier, candidate.location, candidate.k,
                          s.engine_threads)
    log_path = Path(ctx.home) / "logs" / f"{ctx.attempt}-engine.log"
    shown = {k: v for k, v in spec.items() if k != "env"}
    ctx.event("canary", "starting", draft=candidate.ref, checksums=candidate.checksums, engine=_jsonable(shown))
    ctx.say(f"starting the candidate engine for {candidate.ref} (log {log_path})")
    watch = Watch(ctx, candidate.ref)
    engine = _start_watching(ctx, watch, spec, log_path)
    record = engine_record(engine)
    name = deployment_name(candidate)
    launch = {**{k: spec[k] for k in ENGINE_KNOBS if k in spec}, ENGINE_KEY: record,
              CANARY_KEY: {"language": ctx.language, "share": s.canary_share, "attempt": ctx.attempt}}
    try:
        reg.deploy(candidate.ref, name=name, url=engine.url.rstrip("/"), launch=_jsonable(launch),
                   languages=[ctx.language], domain=ctx.domain)
    except Exception:
        engine.stop()
        raise
    if s.calibrate:
        _calibrate(ctx, name)
    routers = ctx.refresh()
    ctx.event("canary", "started", deployment=name, engine=record, share=s.canary_share, routers=routers)
    result, cand, old = monitor(ctx, watch, engine.url.rstrip("/"), record["pid"])
    figures = {"candidate": cand.to_json(), "old": old.to_json()}
    ctx.event("canary", result.decision, deployment=name, **result.to_json(), arms=figures)
    return CanaryOutcome(name, record, result, figures)


def _calibrate(ctx: Ctx, name: str) -> None:
    try:
        results = calibrate_deployments(ctx.reg, [name], batches=[1], waves=1, max_tokens=32, progress=False)
    except Exception as exc:  # the router measures step times live anyway
        results = [{"error": f"{type(exc).__name__}: {exc}"}]
    errors = [r["error"] for r in results if "error" in r]
    ctx.say(f"calibration of {name}: " + ("; ".join(errors) if errors else "stored"))


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def withdraw(ctx: Ctx, candidate: Any, deployment: str, engine: dict[str, Any], why: str) -> dict[str, Any]:
    """Take a candidate out of service: undeploy, let the routers notice, drain, stop its engine, retire it."""
    reg = ctx.reg
    try:
        reg.undeploy(deployment)
    except NotFound:
        pass  # never deployed, or already undeployed
    routers = ctx.refresh()
    drained = drain(engine["url"], ctx.s.drain_timeout_s) if engine.get("url") else {"drained": True}
    stopped = stop_pid(engine.get("pid"), engine.get("port"))
    try:
        reg.set_draft_status(candidate.ref, "retired", who=ctx.who, why=why)
    except RegistryError as exc:  # still deployed elsewhere: leave it
        ctx.say(f"{candidate.ref} stays {candidate.status}: {exc}")
    return {"deployment": deployment, "routers": routers, "drain": drained, "engine": stopped, "why": why}


def swap(ctx: Ctx, candidate: Any, outcome: CanaryOutcome) -> dict[str, Any]:
    """Promote the canary: the candidate becomes active and takes all of its language's traffic; the old
    deployments of exactly that language are undeployed, drained and stopped, their drafts retired."""
    reg, s = ctx.reg, ctx.s
    reg.promote(candidate.ref, languages=[ctx.language], delta=s.gate_delta, epsilon=s.gate_margin,
                gain_on=gain_benchmarks(candidate, ctx.language))
    reg.update_launch(outcome.deployment, remove=[CANARY_KEY], who=ctx.who)
    replaced = [d for d in reg.active_deployments() if d.name != outcome.deployment and d.draft
                and set(d.languages) <= {ctx.language} and d.domain == ctx.domain]
    for dep in replaced:
        reg.undeploy(dep.name)
    routers = ctx.refresh()
    moved = []
    for dep in replaced:
        pid, port = owned_pid(dep)
        drained = drain(dep.url, s.drain_timeout_s) if dep.url else {"drained": True}
        stopped = stop_pid(pid, port) if pid else "not started by adapt or a fleet that records its pid: stops with its fleet"
        still_used = any(d.draft == dep.draft for d in reg.active_deployments())
        if not still_used:
            reg.set_draft_status(dep.draft, "retired", who=ctx.who, why=f"replaced by {candidate.ref}")
        moved.append({"deployment": dep.name, "draft": dep.draft, "url": dep.url, "languages": dep.languages,
                      "domain": dep.domain, "launch": _jsonable(dep.launch), "drain": drained, "engine": stopped,
                      "retired": not still_used})
    return {"candidate": candidate.ref, "deployment": outcome.deployment, "replaced": moved, "routers": routers,
            "before": outcome.arms.get("old"), "after": outcome.arms.get("candidate")}


def restore(ctx: Ctx, swap_details: dict[str, Any]) -> list[dict[str, Any]]:
    """Put back the deployments a swap replaced, starting an engine again where theirs was stopped."""
    reg, s = ctx.reg, ctx.s
    active = {d.name for d in reg.active_deployments()}
    out = []
    for rep in swap_details.get("replaced", []):
        if rep["deployment"] in active:
            continue
        draft = reg.get_draft(rep["draft"])
        if draft.status == "retired":
            reg.set_draft_status(draft.ref, "active", who=ctx.who, why=f"rollback of {swap_details.get('candidate')}")
        launch = {k: v for k, v in (rep.get("launch") or {}).items() if k in ENGINE_KNOBS}
        url = rep.get("url")
        if not url or not _healthy(url, None):
            verifier = reg.get_verifier(draft.verifier).location
            spec = candidate_spec(launch, verifier, draft.location, launch.get("k") or draft.k, s.engine_threads)
            log_path = Path(ctx.home) / "logs" / f"{ctx.attempt}-restore.log"
            engine = start_engine(spec, log_path, timeout_s=s.engine_ready_timeout_s, self_check=s.self_check)
            url, launch[ENGINE_KEY] = engine.url.rstrip("/"), engine_record(engine)
        reg.deploy(draft.ref, name=rep["deployment"], url=url, launch=_jsonable(launch), languages=rep["languages"],
                   domain=rep["domain"])
        out.append({"deployment": rep["deployment"], "draft": draft.ref, "url": url})
    return out
