"""`polyspec deploy ...`: what the speed model says about the fleet (registry.planning), and its open
recommendations."""

from __future__ import annotations

from typing import Optional

import typer

from polyspec.core.cli import PolyspecTyper
from polyspec.registry.cli_base import JsonOpt, _dump, _table

app = PolyspecTyper(name="deploy", help="Plan deployments with the speed model: which engine per language, "
                    "which k, where a draft is missing.", no_args_is_help=True)
RegistryOpt = typer.Option(None, "--registry", help="Registry URL (default: POLYSPEC_REGISTRY_URL).")


def register(root: typer.Typer) -> None:
    """Mount `polyspec deploy` on the root CLI."""
    root.add_typer(app, name="deploy")


def _open(url: Optional[str]):  # noqa: ANN202 - registry.Registry, imported lazily
    from polyspec.registry import open_registry

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
    registry: Optional[str] = RegistryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Per language of the live traffic: the fastest calibrated engine at batch 1, its speed-up over no
    speculation, and what to do; per draft deployment: the k with the highest predicted tokens/s (k: auto).

    Recommendations (train a draft for a language, serve it without speculation, change k) are stored in the
    registry as open rows (`polyspec deploy recommendations`) unless --dry-run. Model and limits: docs/speed.md."""
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
