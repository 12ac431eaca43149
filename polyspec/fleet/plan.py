"""What `polyspec up` will run: one member per active deployment (or per fleet YAML entry,
polyspec/fleet/config.py), each launched here or remote, and the router's table source for it.

Deployments with a URL are remote: registered, never launched; a URL that an earlier fleet wrote back and
did not restore is recognised (LAUNCHED_KEY) and launched again. polyspec/fleet/run.py starts the plan.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from polyspec.core.errors import PolyspecError
from polyspec.core.hostcpu import choose_dtype
from polyspec.core.settings import get_settings
from polyspec.fleet.config import FleetConfig, load_fleet_config
from polyspec.models.verifiers import VerifierError, resolve_verifier
from polyspec.registry import open_registry
from polyspec.router.table import live_row_dict, to_live_row

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
        return [to_live_row(r) for r in self.registry.live_stats()] if self.registry is not None else []

    def record_live_stats(self, router_id: str, rows: Sequence[Any]) -> None:
        if self.registry is not None:
            self.registry.record_live_stats(router_id, [live_row_dict(r) for r in rows])


@dataclass
class UpPlan:
    members: list[Member]
    source: Any  # router.source.TableSource; None = the registry's deployments
    registry: Any  # Registry for URL write-back and live stats, or None
    router_host: str
    router_port: int
    registry_url: str | None = None


def plan_up(config_path: Path | None, *, host: str | None, port: int | None, registry_url: str | None,
            base_port: int = DEFAULT_BASE_PORT) -> UpPlan:
    """What `polyspec up` will run: from the YAML file when given, else the registry's active deployments."""
    if config_path is not None:
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
    try:
        return str(resolve_verifier(spec or get_settings().default_verifier).path)
    except VerifierError as exc:
        raise FleetError(f"verifier {spec!r}: {exc}") from exc


def describe(members: Sequence[Member]) -> Any:
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
