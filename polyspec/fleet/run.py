"""`polyspec up`: start a planned fleet (polyspec/fleet/plan.py), then the router in front.

Launched engines get their URL written back to the registry so the router's table (and other routers
sharing the registry) see them; the previous URL is restored when the fleet stops. Ctrl-C (SIGINT) or
SIGTERM stops the router, then every engine's process group.

Every launched engine gets ``dtype: auto`` unless its deployment or YAML entry says otherwise
(polyspec.core.hostcpu), and must pass the self-check (polyspec.core.selfcheck) before it is published.
A failed self-check fails the whole start loudly (FleetError naming the engine and the likely cause; every
engine is stopped) rather than serving without that engine: the usual cause, a dtype this host computes
wrongly, affects every engine alike, and a fleet silently missing a language would hide it. The verifier's
reference is computed by ``python -m polyspec.models.selfcheck`` in a child process (while the engines
load), so the router never imports torch; it is cached under $POLYSPEC_HOME/selfcheck/.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import select

from polyspec.core.errors import InvalidInput
from polyspec.core.selfcheck import SelfCheckFailed
from polyspec.core.settings import get_settings
from polyspec.engines import calibrate_deployments, print_calibration
from polyspec.fleet.plan import LAUNCHED_KEY, FleetError, Member, UpPlan, describe
from polyspec.fleet.reference import ReferenceJob, ReferenceUnavailable
from polyspec.models.vllm_engine import EngineSpec, VllmEngine
from polyspec.registry.calibrations import LAUNCHED_K
from polyspec.registry.schema import Deployment
from polyspec.router.admin.auth import unsafe_admin
from polyspec.router.app import create_app
from polyspec.router.config import RouterConfig
from polyspec.router.edge.server import build_server

log = logging.getLogger("polyspec.fleet")


def set_deployment_url(registry: Any, name: str, url: str | None, *, launched: bool, k: int | None = None) -> str | None:
    """Point a deployment at ``url`` in one registry transaction; returns the URL it had before.

    ``launched`` marks the URL as ours (see LAUNCHED_KEY) so a crashed fleet's URL is not mistaken
    for a remote engine next time; ``k``, the k its engine was started with, is kept beside it (a
    ``k: auto`` resolved), so calibrations and the router know it."""
    with registry.session(write=True) as s:
        row = s.scalars(select(Deployment).where(Deployment.name == name)).first()
        if row is None:
            raise FleetError(f"deployment {name!r} disappeared from the registry")
        previous, stale = row.url, (row.launch or {}).get(LAUNCHED_KEY)
        row.url = url
        launch = {key: v for key, v in (row.launch or {}).items() if key not in (LAUNCHED_KEY, LAUNCHED_K)}
        mine = {LAUNCHED_KEY: url, **({LAUNCHED_K: k} if k is not None else {})}
        row.launch = {**launch, **mine} if launched else launch
        return None if previous is not None and previous == stale else previous


def share_cpus(launch: dict[str, Any], engines: int) -> dict[str, Any]:
    """Engine knobs with CPU sharing filled in. vLLM's default binding pins every engine to the same
    cores; with several engines on one small host, unpinned OpenMP threads (cores / engines each) let
    the OS spread them (models.vllm_engine.EngineSpec.cpu_bind explains the measurements)."""
    spec = {k: v for k, v in launch.items() if v is not None or k == "draft"}
    if engines > 1 and "cpu_bind" not in spec:
        spec["cpu_bind"] = "nobind"
        spec.setdefault("threads", max(1, (os.cpu_count() or 1) // engines))
    return spec


class Fleet:
    """Starts the launched members' engines, self-checks them, publishes their URLs, and stops everything on exit."""

    def __init__(self, members: Sequence[Member], logs_dir: Path, registry: Any = None, self_check: bool = True) -> None:
        self.members = list(members)
        self.logs_dir = Path(logs_dir)
        self.registry = registry
        self.self_check = self_check
        self.engines: dict[str, Any] = {}
        self._restore: dict[str, str | None] = {}

    def log_path(self, member: Member) -> Path:
        return self.logs_dir / f"{member.name}.log"

    def start(self, timeout: float = 900.0, progress: bool = True) -> None:
        """Launch every local engine at once (their startups overlap), wait for each /health, self-check
        each one (FleetError on a failure), and only then give them URLs and publish them."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        local = [m for m in self.members if not m.remote]
        for m in local:
            spec = EngineSpec(**share_cpus(m.launch, len(local)))
            engine = VllmEngine(spec, self.log_path(m))
            self.engines[m.name] = engine
            choice = spec.dtype_choice()
            log.info("starting engine %s on port %s, dtype %s (%s; log: %s)", m.name, spec.port, choice.dtype,
                     choice.reason, self.log_path(m))
            engine.start()
        jobs: dict[str, ReferenceJob] = {}
        if self.self_check:
            for verifier in dict.fromkeys(str(m.launch["verifier"]) for m in local):
                jobs[verifier] = ReferenceJob(verifier, self.logs_dir / "selfcheck-reference.log")
        try:
            for m in local:
                try:
                    self.engines[m.name].wait_ready(timeout=timeout, progress=progress)
                except Exception as exc:
                    raise FleetError(f"engine {m.name} did not become ready: {exc} (log: {self.log_path(m)})") from exc
            for m in local:
                if self.self_check:
                    self._check(m, jobs[str(m.launch["verifier"])], timeout)
                m.url = self.engines[m.name].url.rstrip("/")
        finally:
            for job in jobs.values():
                job.cancel()
        self.publish()

    def _check(self, member: Member, job: ReferenceJob, timeout: float) -> None:
        try:
            report = self.engines[member.name].self_check(job.result(timeout))
        except ReferenceUnavailable as exc:
            raise FleetError(f"engine {member.name} cannot be self-checked: {exc}") from exc
        except SelfCheckFailed as exc:
            raise FleetError(f"engine {member.name} is not served: {exc} (log: {self.log_path(member)})") from exc
        log.info("engine %s self-check: %s", member.name, report.summary())

    def publish(self) -> None:
        if self.registry is None:
            return
        for m in self.members:
            if not m.remote and m.deployment:
                k = m.launch.get("k") if m.launch and m.launch.get("draft") else None
                previous = set_deployment_url(self.registry, m.deployment, m.url, launched=True, k=k)
                self._restore.setdefault(m.deployment, previous)

    def stop(self) -> None:
        """Idempotent: unpublish URLs (so no router sends traffic to stopped engines), stop engines."""
        for name, previous in list(self._restore.items()):
            try:
                set_deployment_url(self.registry, name, previous, launched=False)
            except Exception as exc:  # the engines must still be stopped
                log.warning("could not restore the URL of deployment %s: %s", name, exc)
            self._restore.pop(name, None)
        for name, engine in list(self.engines.items()):
            try:
                engine.stop()
            except Exception as exc:
                log.warning("could not stop engine %s cleanly: %s", name, exc)
            self.engines.pop(name, None)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C while engines start, so `kill` also cleans up (uvicorn installs its own later)."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_up(plan: UpPlan, *, logs_dir: Path, ready_timeout: float = 900.0, log_level: str = "warning",
           router_id: str | None = None, on_ready: Any = None, self_check: bool = True,
           calibrate: bool = False) -> None:
    """Start engines (self-checked unless ``self_check`` is False), calibrate them for the speed policy when
    asked, then the router; return after Ctrl-C/SIGTERM with everything stopped.

    A KeyboardInterrupt escapes only when the stop came while engines were still starting."""
    config = _router_config(plan, router_id)
    problem = unsafe_admin(config, get_settings().admin_token)  # refused before any engine starts
    if problem is not None:
        raise InvalidInput(problem)
    console = Console(stderr=True)
    console.print(describe(plan.members))
    fleet = Fleet(plan.members, logs_dir, registry=plan.registry if plan.source is None else None,
                  self_check=self_check)
    # SIGTERM = Ctrl-C for the whole run, so `kill PID` stops the engines too.
    with sigterm_as_interrupt():
        try:
            fleet.start(timeout=ready_timeout)
            if calibrate:
                calibrate_members(plan, console)
            _serve(plan, config, console, log_level, on_ready)
        finally:
            console.print("stopping engines…")
            fleet.stop()
            if plan.registry is not None:
                plan.registry.close()
            console.print("fleet stopped")


def calibrate_members(plan: UpPlan, console: Any) -> None:
    """A quick calibration (batch 1 and 2, 32 tokens) of the fleet's registry deployments, before the router
    starts, so that its first table has step times (router.decision.speed). A failure is reported, not fatal: the
    router then measures step times live."""
    names = [m.deployment for m in plan.members if m.deployment]
    if plan.registry is None or plan.source is not None or not names:
        console.print("[yellow]--calibrate: only a fleet planned from the registry is calibrated; skipped[/]")
        return
    console.print(f"calibrating {len(names)} engine(s) for the speed policy…")
    results = calibrate_deployments(plan.registry, names, batches=[1, 2], waves=1, max_tokens=32, progress=False)
    print_calibration(results, console)


def _router_config(plan: UpPlan, router_id: str | None) -> RouterConfig:
    overrides = {"router_id": router_id} if router_id else {}
    return RouterConfig(host=plan.router_host, port=plan.router_port, registry_url=plan.registry_url, **overrides)


def _serve(plan: UpPlan, config: RouterConfig, console: Any, log_level: str, on_ready: Any) -> None:
    app = create_app(config, source=plan.source)
    server = build_server(app, config, log_level=log_level)  # as `polyspec serve`: drain, head limits
    base = f"http://{config.host}:{config.port}"
    console.print(f"[green]router ready[/] on {base}/v1  ·  dashboard {base}/admin  ·  Ctrl-C stops everything")
    if on_ready is not None:
        on_ready(base)
    try:
        # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal: a normal stop.
        server.run()
    except KeyboardInterrupt:
        pass
