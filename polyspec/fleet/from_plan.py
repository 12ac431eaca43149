"""`polyspec up --plan plan.yaml`: serve exactly the fleet of a plan (`polyspec deploy plan --engines N --write`).

Everything is checked before anything is written or started: the file (YAML, schema version, fields), the
verifier it was planned for, every draft it names (in the registry, not retired) and the memory its engines
need. Then, in one registry transaction, each entry becomes one active deployment per replica (``NAME``,
``NAME-2``, ...) launched with the plan's k; deployments of the same name that differ are replaced. Only the
plan's deployments are launched.

``--plan auto`` plans first, for as many engines as free memory holds (``auto_plan``), over the live traffic
or, before there is any, the deployments' or the active drafts' languages; `polyspec up` on a registry with no
active deployment and `polyspec demo` do the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyspec.core.settings import get_settings
from polyspec.fleet.plan import DEFAULT_BASE_PORT, UpPlan, plan_from_registry
from polyspec.registry import deployments, open_registry
from polyspec.registry.cli_plan import print_fleet_plan
from polyspec.registry.fleet_inputs import default_traffic, drafts_of, make_plan, plan_verifier
from polyspec.registry.fleet_plan import (
    ENGINE_GIB, Cell, FleetPlan, PlanEntry, available_gib, check_against, check_engines, memory_capacity, read_plan,
)
from polyspec.registry.store import draft_row

# Launch knobs of a planned engine (the demo's and the speed bench's: small, so engines fit beside each other).
PLAN_LAUNCH = {"max_model_len": 2048, "kv_cache_gib": 1}
AUTO = "auto"  # `polyspec up --plan auto`: plan for the engines free memory holds


def replica_names(entry: PlanEntry) -> list[str]:
    return [entry.name if i == 0 else f"{entry.name}-{i + 1}" for i in range(entry.replicas)]


def checked_plan(path: Path, registry: Any, *, memory: bool = True, memory_gib: float | None = None,
                 engine_gib: float = ENGINE_GIB) -> FleetPlan:
    """The plan in ``path``, refused (PlanError, NotFound) unless it fits this registry and, with ``memory``,
    this machine's free memory."""
    plan = read_plan(path)
    if memory:
        check_engines(plan.engines_used, available_gib() if memory_gib is None else memory_gib, engine_gib)
    with registry.session() as s:
        verifier = plan_verifier(s, None, get_settings().default_verifier)
        check_against(plan, verifier, drafts_of(s, verifier), path=path)
    return plan


def apply_plan(registry: Any, plan: FleetPlan, launch: dict[str, Any] | None = None, prefix: str = "") -> list[str]:
    """Make the plan's entries active deployments named ``prefix`` + entry (+ "-2", ... per replica), in one
    transaction; an active deployment of that name serving something else is replaced. Returns the names."""
    knobs = dict(PLAN_LAUNCH if launch is None else launch)
    names: list[str] = []
    current = {d.name: d for d in registry.active_deployments()}
    with registry.session(write=True) as s:
        for entry in plan.entries:
            for i, name in enumerate(prefix + n for n in replica_names(entry)):
                names.append(name)
                have, default = current.get(name), entry.default and i == 0
                if have is not None and have.draft == entry.draft and (have.launch or {}).get("k") == (entry.k or None) \
                        and have.is_default == default:
                    continue
                if have is not None:
                    deployments.undeploy(s, name)
                row = draft_row(s, entry.draft) if entry.draft else None
                deployments.deploy(s, row, name=name, languages=entry.languages or None, default=default,
                                   launch={**knobs, **({"k": entry.k} if entry.k else {})}, verifier=plan.verifier)
    return names


def auto_plan(registry: Any, traffic: list[Cell] | None = None, *, memory_gib: float | None = None,
              engine_gib: float = ENGINE_GIB) -> FleetPlan:
    """The plan for as many engines as free memory holds (registry.fleet_plan.memory_capacity), over
    ``traffic`` or else the live statistics', the deployments' or the active drafts' languages."""
    free = available_gib() if memory_gib is None else memory_gib
    engines = memory_capacity(free, engine_gib)
    check_engines(max(engines, 1), free, engine_gib)  # no engine fits: refused here
    with registry.session() as s:
        verifier = plan_verifier(s, None, get_settings().default_verifier)
        cells = traffic if traffic is not None else default_traffic(s, verifier)
        return make_plan(s, engines=engines, traffic=cells, verifier=verifier,
                         default_verifier=get_settings().default_verifier)


def serve_plan(registry: Any, plan: FleetPlan, *, host: str | None, port: int | None, registry_url: str | None,
               base_port: int = DEFAULT_BASE_PORT, launch: dict[str, Any] | None = None, prefix: str = "") -> UpPlan:
    """The plan applied to the registry and its deployments as `polyspec up`'s members (launched here)."""
    names = set(apply_plan(registry, plan, launch, prefix))
    router_host, router_port = host or "127.0.0.1", port or 8000
    chosen = [d for d in registry.active_deployments() if d.name in names]
    members = plan_from_registry(chosen, base_port=base_port, reserved=[router_port])
    return UpPlan(members, None, registry, router_host, router_port, registry_url)


def plan_up_from_file(path: Path, *, host: str | None, port: int | None, registry_url: str | None,
                      base_port: int = DEFAULT_BASE_PORT, memory_gib: float | None = None) -> UpPlan:
    """What `polyspec up --plan FILE` runs (``--plan auto``: the plan for the engines free memory holds)."""
    registry = open_registry(registry_url)
    try:
        auto = str(path) == AUTO
        plan = auto_plan(registry, memory_gib=memory_gib) if auto else checked_plan(path, registry, memory_gib=memory_gib)
        if auto:
            print_fleet_plan(plan)
        return serve_plan(registry, plan, host=host, port=port, registry_url=registry_url, base_port=base_port)
    except BaseException:
        registry.close()
        raise
