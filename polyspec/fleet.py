"""`polyspec up`: one vLLM engine per active deployment (or per YAML entry), then the router in front.

The plan comes from the registry's active deployments or from a fleet YAML file (polyspec/fleet_config.py).
Deployments with a URL are remote: registered, never launched. Launched engines get their URL written
back to the registry so the router's table (and other routers sharing the registry) see them; the
previous URL is restored when the fleet stops. Ctrl-C (SIGINT) or SIGTERM stops the router, then
every engine's process group.

Every launched engine gets ``dtype: auto`` unless its deployment or YAML entry says otherwise
(polyspec.core.hostcpu), and must pass the self-check (polyspec.core.selfcheck) before it is published.
A failed self-check fails the whole start loudly (FleetError naming the engine and the likely cause; every
engine is stopped) rather than serving without that engine: the usual cause, a dtype this host computes
wrongly, affects every engine alike, and a fleet silently missing a language would hide it. The verifier's
reference is computed by ``python -m polyspec.models.selfcheck`` in a child process (while the engines
load), so the router never imports torch; it is cached under $POLYSPEC_HOME/selfcheck/.
"""

from __future__ import annotations

from polyspec.core.errors import PolyspecError

import logging
import signal
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyspec.core.hostcpu import choose_dtype
from polyspec.core.selfcheck import SelfCheckFailed
from polyspec.fleet_reference import ReferenceJob, ReferenceUnavailable
from polyspec.fleet_config import FleetConfig

log = logging.getLogger("polyspec.fleet")

DEFAULT_BASE_PORT = 8101
LAUNCHED_KEY = "launched_url"  # kept in Deployment.launch while `polyspec up` serves that deployment
LAUNCH_KEYS = ("k", "max_model_len", "kv_cache_gib", "dtype", "cpu_bind", "threads", "served_model_name",
               "extra_args", "env")


class FleetError(PolyspecError):
    """The fleet cannot be planned or an engine failed to start."""


@dataclass
class Member:
    """One backend of the fleet: launched here (``launch`` set) or remote (``url`` set)."""

    name: str
    languages: list[str]
    domain: str = "general"
    draft: str | None = None  # display name / registry ref
    is_default: bool = False
    url: str | None = None
    launch: dict[str, Any] | None = None  # EngineSpec fields
    deployment: str | None = None  # registry deployment to write the URL back to
    offline_mal: dict[str, float] = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        return self.launch is None


def _free_port(taken: set[int], start: int) -> int:
    port = start
    while port in taken:
        port += 1
    taken.add(port)
    return port


def plan_from_registry(deployments: Sequence[Any], *, host: str = "127.0.0.1", base_port: int = DEFAULT_BASE_PORT,
                       reserved: Sequence[int] = (), auto_k: Mapping[str, int] | None = None) -> list[Member]:
    """Members for the registry's active deployments. A deployment with a URL and no launch port is
    remote (unless the URL is one a previous fleet left behind); the others are launched. A launch spec
    with ``k: auto`` gets ``auto_k[name]`` (the speed model's best k, `polyspec deploy plan`), else the k
    the deployment has (its draft's)."""
    if not deployments:
        raise FleetError("no active deployments in the registry (deploy one with `polyspec registry deploy`)")
    taken = set(reserved) | {int(d.launch["port"]) for d in deployments if (d.launch or {}).get("port")}
    members = []
    for dep in deployments:
        launch = dict(dep.launch or {})
        # A URL that an earlier `polyspec up` wrote (and did not get to restore) is not a remote engine.
        stale = bool(dep.url) and launch.get(LAUNCHED_KEY) == dep.url
        remote = bool(dep.url) and not stale and not launch.get("port")
        if remote:
            spec = None
        else:
            if not dep.verifier_location:
                raise FleetError(f"deployment {dep.name!r} has no verifier location to launch")
            spec = {
                "verifier": dep.verifier_location, "draft": dep.draft_location, "k": dep.k or 3, "host": host,
                **{k: v for k, v in launch.items() if k in LAUNCH_KEYS},
                "port": int(launch.get("port") or _free_port(taken, base_port)),
            }
            if spec["k"] == "auto":
                spec["k"] = (auto_k or {}).get(dep.name) or dep.k or 3
        members.append(Member(
            name=dep.name, languages=list(dep.languages), domain=dep.domain, draft=dep.draft,
            is_default=dep.is_default, url=dep.url if remote else None, launch=spec, deployment=dep.name,
            offline_mal=dict(dep.offline_mal),
        ))
    return members


def plan_from_config(cfg: FleetConfig, verifier_location: str, host: str = "127.0.0.1") -> list[Member]:
    members = []
    taken = {cfg.router.port} | {e.port for e in cfg.engines if e.port}
    for entry in cfg.engines:
        if entry.remote:
            spec = None
        else:
            if entry.draft is not None and not Path(entry.draft).expanduser().is_dir():
                raise FleetError(f"engine {entry.name!r}: draft directory not found: {entry.draft}")
            spec = {
                "verifier": verifier_location,
                "draft": str(Path(entry.draft).expanduser().resolve()) if entry.draft else None,
                "k": entry.k, "host": host, "port": entry.port or _free_port(taken, DEFAULT_BASE_PORT),
                "max_model_len": entry.max_model_len, "kv_cache_gib": entry.kv_cache_gib, "dtype": entry.dtype,
                "cpu_bind": entry.cpu_bind, "threads": entry.threads, "extra_args": list(entry.extra_args),
            }
        members.append(Member(
            name=entry.name, languages=entry.languages, domain=entry.domain,
            draft=Path(entry.draft).name if entry.draft and not entry.remote else entry.draft,
            is_default=entry.default, url=entry.url, launch=spec,
        ))
    return members


class StaticSource:
    """A routing-table source for a YAML fleet: its members are the deployments; live stats still go to
    the registry when one is given (so a YAML fleet's traffic shows up like any other)."""

    def __init__(self, members: Sequence[Member], registry: Any = None) -> None:
        self.members = members
        self.registry = registry

    def deployments(self) -> list[dict[str, Any]]:
        return [
            {"name": m.name, "url": m.url, "languages": m.languages, "domain": m.domain,
             "draft": m.draft, "is_default": m.is_default, "offline_mal": m.offline_mal}
            for m in self.members if m.url
        ]

    def live_stats(self) -> list[Any]:
        from polyspec.router.table import to_live_row

        return [to_live_row(r) for r in self.registry.live_stats()] if self.registry is not None else []

    def record_live_stats(self, router_id: str, rows: Sequence[Any]) -> None:
        if self.registry is not None:
            from polyspec.router.table import live_row_dict

            self.registry.record_live_stats(router_id, [live_row_dict(r) for r in rows])


def set_deployment_url(registry: Any, name: str, url: str | None, *, launched: bool, k: int | None = None) -> str | None:
    """Point a deployment at ``url`` in one registry transaction; returns the URL it had before.

    ``launched`` marks the URL as ours (see LAUNCHED_KEY) so a crashed fleet's URL is not mistaken
    for a remote engine next time; ``k``, the k its engine was started with, is kept beside it (a
    ``k: auto`` resolved), so calibrations and the router know it."""
    from sqlalchemy import select

    from polyspec.registry.calibrations import LAUNCHED_K
    from polyspec.registry.schema import Deployment

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
    import os

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
        from polyspec.models.vllm_engine import EngineSpec, VllmEngine

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


@dataclass
class UpPlan:
    members: list[Member]
    source: Any  # router.table.TableSource; None = the registry's deployments
    registry: Any  # Registry for URL write-back and live stats, or None
    router_host: str
    router_port: int
    registry_url: str | None = None


def plan_up(config_path: Path | None, *, host: str | None, port: int | None, registry_url: str | None,
            base_port: int = DEFAULT_BASE_PORT) -> UpPlan:
    """What `polyspec up` will run: from the YAML file when given, else the registry's active deployments."""
    from polyspec.registry import open_registry

    if config_path is not None:
        from polyspec.fleet_config import load_fleet_config

        cfg = load_fleet_config(config_path)
        router_host, router_port = host or cfg.router.host, port or cfg.router.port
        verifier = ""
        if any(not e.remote for e in cfg.engines):
            verifier = _verifier_location(cfg.verifier)
        members = plan_from_config(cfg, verifier)
        try:
            registry = open_registry(registry_url)
        except Exception as exc:  # a YAML fleet can run without a registry; live stats then stay in memory
            log.warning("no registry for live stats (%s); continuing without one", exc)
            registry = None
        return UpPlan(members, StaticSource(members, registry), registry, router_host, router_port, registry_url)
    registry = open_registry(registry_url)
    router_host, router_port = host or "127.0.0.1", port or 8000
    deployments = registry.active_deployments()
    auto_k = {}
    if any((d.launch or {}).get("k") == "auto" for d in deployments):
        # The speed model's best k over each deployment's traffic (needs calibrations; else the draft's k).
        auto_k = {kp.deployment: kp.best_k for kp in registry.plan(record=False).k if kp.best_k}
    members = plan_from_registry(deployments, base_port=base_port, reserved=[router_port], auto_k=auto_k)
    return UpPlan(members, None, registry, router_host, router_port, registry_url)


def _verifier_location(spec: str | None) -> str:
    from polyspec.models.verifiers import VerifierError, resolve_verifier
    from polyspec.core.settings import get_settings

    try:
        return str(resolve_verifier(spec or get_settings().default_verifier).path)
    except VerifierError as exc:
        raise FleetError(f"verifier {spec!r}: {exc}") from exc


def describe(members: Sequence[Member]) -> Any:
    from rich.table import Table

    table = Table(title="polyspec fleet")
    for col in ("backend", "languages", "domain", "draft", "where", "dtype"):
        table.add_column(col)
    for m in members:
        where = m.url if m.remote else f"launch on :{m.launch['port']}"
        name = m.name + (" (default)" if m.is_default else "")
        dtype = "-" if m.remote else _dtype_label(m.launch.get("dtype") or "auto")
        table.add_row(name, ", ".join(m.languages) or "-", m.domain, m.draft or "none", where, dtype)
    return table


def _dtype_label(requested: str) -> str:
    """What the engine will run at, with the reason when ``auto`` decided (shown before the engines start)."""
    try:
        choice = choose_dtype(requested)
    except ValueError as exc:
        raise FleetError(str(exc)) from None
    return choice.dtype if choice.requested != "auto" else f"{choice.dtype} ({choice.reason})"


def run_up(plan: UpPlan, *, logs_dir: Path, ready_timeout: float = 900.0, log_level: str = "warning",
           router_id: str | None = None, on_ready: Any = None, self_check: bool = True,
           calibrate: bool = False) -> None:
    """Start engines (self-checked unless ``self_check`` is False), calibrate them for the speed policy when
    asked, then the router; return after Ctrl-C/SIGTERM with everything stopped.

    A KeyboardInterrupt escapes only when the stop came while engines were still starting."""
    from rich.console import Console

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
            _serve(plan, console, log_level, router_id, on_ready)
        finally:
            console.print("stopping engines…")
            fleet.stop()
            if plan.registry is not None:
                plan.registry.close()
            console.print("fleet stopped")


def calibrate_members(plan: UpPlan, console: Any) -> None:
    """A quick calibration (batch 1 and 2, 32 tokens) of the fleet's registry deployments, before the router
    starts, so that its first table has step times (router.speed). A failure is reported, not fatal: the
    router then measures step times live."""
    from polyspec.engines import calibrate_deployments, print_calibration

    names = [m.deployment for m in plan.members if m.deployment]
    if plan.registry is None or plan.source is not None or not names:
        console.print("[yellow]--calibrate: only a fleet planned from the registry is calibrated; skipped[/]")
        return
    console.print(f"calibrating {len(names)} engine(s) for the speed policy…")
    results = calibrate_deployments(plan.registry, names, batches=[1, 2], waves=1, max_tokens=32, progress=False)
    print_calibration(results, console)


def _serve(plan: UpPlan, console: Any, log_level: str, router_id: str | None, on_ready: Any) -> None:
    from polyspec.router.app import create_app
    from polyspec.router.config import RouterConfig
    from polyspec.router.server import build_server

    overrides = {"router_id": router_id} if router_id else {}
    config = RouterConfig(host=plan.router_host, port=plan.router_port,
                          registry_url=plan.registry_url, **overrides)
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
