"""`polyspec deploy ...`: what the speed model says about the fleet (registry.planning), and its open
recommendations."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from polyspec.core.cli import PolyspecTyper
from polyspec.core.settings import get_settings
from polyspec.registry import open_registry
from polyspec.registry.cli_base import JsonOpt, _dump, _table
from polyspec.registry.fleet_inputs import make_plan
from polyspec.registry.fleet_plan import available_gib, check_engines, parse_traffic, write_plan

app = PolyspecTyper(name="deploy", help="Plan deployments with the speed model: which engine per language, "
                    "which k, where a draft is missing.", no_args_is_help=True)
RegistryOpt = typer.Option(None, "--registry", help="Registry URL (default: POLYSPEC_REGISTRY_URL).")


def register(root: typer.Typer) -> None:
    """Mount `polyspec deploy` on the root CLI."""
    root.add_typer(app, name="deploy")


def _open(url: Optional[str]):  # noqa: ANN202 - a registry.Registry
    return open_registry(url, create=False)


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


@app.command("plan")
def plan(
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; store no recommendation."),
    min_share: float = typer.Option(0.05, min=0.0, max=1.0, help="Traffic share below which no draft is "
                                    "recommended for a language."),
    min_speedup: float = typer.Option(1.10, min=1.0, help="A language whose best engine is less than this much "
                                      "faster than no speculation, and has no draft of its own, gets a "
                                      "'train a draft for it' recommendation."),
    min_k_gain: float = typer.Option(1.03, min=1.0, help="Recommend another k only when it predicts at least this "
                                     "gain in tokens/s."),
    engines: Optional[int] = typer.Option(None, "--engines", help="Choose the fleet for this many engine slots: "
                                          "which drafts (and k, or no speculation) on how many replicas."),
    traffic: Optional[str] = typer.Option(None, "--traffic", help="With --engines: the mix to plan for, "
                                          "LANGUAGE[:DOMAIN]=SHARE,... summing to 1 (default: the live statistics)."),
    write: Optional[Path] = typer.Option(None, "--write", dir_okay=False, help="With --engines: save the plan "
                                         "(YAML) for `polyspec up --plan` and `polyspec deploy k8s --plan`."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="With --engines: the verifier to plan for "
                                           "(default: the active deployments', else POLYSPEC_DEFAULT_VERIFIER)."),
    concurrency: float = typer.Option(1.0, min=1.0, help="With --engines: streams in flight over the fleet; "
                                      "a replica helps only when its share of them exceeds one."),
    answer_tokens: int = typer.Option(96, min=1, help="With --engines: tokens per answer, for prefill's share."),
    prompt_tokens: int = typer.Option(110, min=0, help="With --engines: prompt tokens per request (chat "
                                      "template included)."),
    memory_gib: Optional[float] = typer.Option(None, "--memory-gib", help="With --engines: memory to plan "
                                               "within (default: what is available now)."),
    engine_gib: float = typer.Option(3.5, "--engine-gib", help="With --engines: memory one engine takes."),
    registry: Optional[str] = RegistryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Per language of the live traffic: the fastest calibrated engine at batch 1, its speed-up over no
    speculation, and what to do; per draft deployment: the k with the highest predicted tokens/s (k: auto).

    Recommendations (train a draft for a language, serve it without speculation, change k) are stored in the
    registry as open rows (`polyspec deploy recommendations`) unless --dry-run. Model and limits: docs/speed.md.

    With --engines N it chooses the fleet instead: the deployments and replicas over N engine slots with the
    highest traffic-weighted predicted tokens/s (registry.fleet_search)."""
    if engines is not None:
        return _fleet(engines, traffic, write, verifier, registry, as_json, memory_gib=memory_gib,
                      engine_gib=engine_gib, answer_tokens=answer_tokens, prompt_tokens=prompt_tokens,
                      concurrency=concurrency)
    if traffic is not None or write is not None:
        from polyspec.registry.fleet_plan import PlanError

        raise PlanError("--traffic and --write plan a fleet: give --engines N with them")
    with _open(registry) as reg:
        result = reg.plan(min_share=min_share, min_speedup=min_speedup, min_k_gain=min_k_gain, record=not dry_run)
    if as_json:
        return _dump(result.to_json())
    _table("Languages: the fastest engine (predicted tokens/s of one stream, batch 1)",
           ["language", "requests", "share", "fastest", "tok/s", "no speculation tok/s", "speed-up", "advice"],
           [[lp.language, lp.requests, f"{lp.share:.0%}", lp.best.deployment if lp.best else "-",
             _num(lp.best.tps if lp.best else None), _num(lp.plain_tps), _num(lp.speedup, "{:.2f}x"), lp.advice]
            for lp in result.languages])
    _table("Draft deployments: k (vLLM fixes it per engine; k: auto takes the best)",
           ["deployment", "draft", "k now", "best k", "tok/s at k now", "tok/s at best k", "note"],
           [[kp.deployment, kp.draft, kp.k, kp.best_k or "-", _num(kp.tps_by_k.get(kp.k)),
             _num(kp.tps_by_k.get(kp.best_k) if kp.best_k else None), kp.note] for kp in result.k])
    verb = "would be recorded" if dry_run else "recorded (open)"
    _table(f"Recommendations {verb}", ["kind", "subject", "why"],
           [[r["kind"], r["subject"], r["details"].get("why") or r["details"].get("gain") or ""]
            for r in result.recommendations])


def _fleet(engines: int, traffic: Optional[str], write: Optional[Path], verifier: Optional[str],
           registry: Optional[str], as_json: bool, *, memory_gib: Optional[float], engine_gib: float,
           **settings: float) -> None:
    """`deploy plan --engines N`: every input is checked before the registry is read, the plan before it is written."""
    check_engines(engines, available_gib() if memory_gib is None else memory_gib, engine_gib)
    cells = parse_traffic(traffic) if traffic is not None else None
    with _open(registry) as reg, reg.session() as s:
        result = make_plan(s, engines=engines, traffic=cells, verifier=verifier,
                           default_verifier=get_settings().default_verifier, **settings)
    if write is not None:
        write_plan(result, write)
    if as_json:
        return _dump(result.model_dump(mode="json"))
    print_fleet_plan(result)
    if write is not None:
        typer.echo(f"plan written to {write} (serve it: polyspec up --plan {write})")


def print_fleet_plan(result: Any) -> None:
    """The plan's deployments, its per-cell predictions and what each engine adds (registry.fleet_plan.FleetPlan)."""
    _table(f"Fleet for {result.engines} engine slot(s), verifier {result.verifier}: {result.engines_used} used",
           ["deployment", "draft", "k", "replicas", "serves"],
           [[e.name + (" (default)" if e.default else ""), e.draft or "none (no speculation)", e.k, e.replicas,
             ", ".join(e.languages) or "-"] for e in result.entries])
    _table("Predicted per cell (tokens/s of one stream, prefill included)",
           ["language", "domain", "share", "engine", "tokens/step", "ms/step", "tok/s", "no speculation tok/s",
            "speed-up"],
           [[p.language, p.domain, f"{p.share:.0%}", p.entry, f"{p.tokens_per_step:.2f}", f"{p.step_ms:.1f}",
             f"{p.tps:.1f}", f"{p.plain_tps:.1f}", f"{p.speedup:.2f}x"] for p in result.predicted])
    _table("What each engine adds (the best fleet of each size)", ["engines", "weighted tok/s", "added", "to"],
           [[m.engines, f"{m.weighted_tps:.2f}", f"{m.added_tps:+.2f}", m.added] for m in result.marginal])
    typer.echo(f"traffic-weighted: {result.weighted_tps:.2f} tok/s, {result.speedup:.2f}x no speculation "
               f"({result.plain_weighted_tps:.2f}); step times: {result.assumptions.get('step_times')}")


@app.command("recommendations")
def recommendations(
    kind: Optional[str] = typer.Option(None, "--kind", help="train-draft, no-speculation or change-k."),
    registry: Optional[str] = RegistryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Open recommendations, oldest first."""
    with _open(registry) as reg:
        rows = reg.recommendations(kind)
    if as_json:
        return _dump(rows)
    _table("Open recommendations", ["id", "kind", "subject", "since", "figures"],
           [[r["id"], r["kind"], r["subject"], (r["created_at"] or "")[:19], r["details"]] for r in rows])
