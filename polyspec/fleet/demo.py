"""The demo's fleet: planned, not hand-picked. The shipped multilingual draft joins the English and French ones,
and `polyspec deploy plan`'s search (registry.fleet_search) chooses the engines for the demo's traffic, as many
as free memory holds and no more than add predicted tokens/s. Its deployments are named ``demo-ENTRY``;
earlier demo deployments the plan does not keep are undeployed, so the demo serves exactly its plan.
"""

from __future__ import annotations

from typing import Any

from polyspec.fleet.from_plan import auto_plan, replica_names
from polyspec.models.shipped import shipped_drafts
from polyspec.registry.cli_plan import print_fleet_plan
from polyspec.registry.fleet_plan import Cell, FleetPlan, cell

PREFIX = "demo-"


def ensure_multilingual(reg: Any, verifier: Any, console: Any, install: Any) -> str | None:
    """The shipped multilingual draft, active in the registry (``install``: demo.install_shipped); None when
    this checkout ships none for the verifier."""
    shipped = next((d for d in shipped_drafts(verifier.name) if d.role == "multilingual"), None)
    if shipped is None:
        return None
    active = [d for d in reg.drafts(verifier=verifier.name, status="active") if d.name == shipped.name]
    if active:
        console.print(f"[green]✓[/] active multilingual draft in the registry: {active[-1].ref}")
        return active[-1].ref
    return install(reg, shipped, console)


def demo_traffic(languages: tuple[str, ...]) -> list[Cell]:
    """The demo sends each language alike."""
    return [cell(lang, "general", 1 / len(languages)) for lang in languages]


def plan_demo_fleet(reg: Any, languages: tuple[str, ...], console: Any) -> FleetPlan:
    """The plan for the demo's traffic on the engines free memory holds, printed; earlier demo deployments
    it does not keep are undeployed."""
    plan = auto_plan(reg, demo_traffic(languages))
    print_fleet_plan(plan)
    keep = {PREFIX + name for entry in plan.entries for name in replica_names(entry)}
    for dep in reg.active_deployments():
        if dep.name.startswith(PREFIX) and dep.name not in keep:
            reg.undeploy(dep.name)
            console.print(f"undeployed {dep.name} (not in the plan)")
    return plan


def planned_tps(plan: FleetPlan) -> dict[str, float]:
    """Language -> the plan's predicted tokens/s (its general-domain cell)."""
    return {p.language: p.tps for p in plan.predicted if p.domain == "general"}
