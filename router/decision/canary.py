"""Canary routing: a deployment that `polyspec adapt` marked as a canary for a language takes a set share of that
language's requests, and is only a fallback for everything else.

The mark lives in the deployment's launch spec, ``{"canary": {"language": "it", "share": 0.1, ...}}``
(polyspec.adapt.canary). For a request of that language, with probability ``share`` the canary's pool goes
first; otherwise, and for every other language, the ranking is the policy's own with the canary's pool
moved last, so it can still take a request whose other replicas all failed. Promotion removes the mark and
the pool competes like any other.

Wired in two places: ``router.runtime.RouterRuntime._refresh`` builds each new table with
``canaries_of(deployments)`` (``RoutingTable.canaries``), and ``router.decision.routing.route`` calls ``apply``
after the ranking (either policy).

Cost: one dict lookup per replica of the ranked pools, nothing when there is no canary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from polyspec.router.table import Pool, field_of

CANARY_KEY = "canary"
Canaries = Mapping[str, tuple[str, float]]  # replica URL -> (language, share)


def canaries_of(deployments: Iterable[Any]) -> dict[str, tuple[str, float]]:
    """Replica URL -> (language, share) for the deployments marked as canaries. A malformed mark (no language,
    a share outside [0, 1] or not a number) is ignored: the deployment is then routed as any other."""
    out: dict[str, tuple[str, float]] = {}
    for dep in deployments:
        url, launch = field_of(dep, "url"), field_of(dep, "launch") or {}
        mark = launch.get(CANARY_KEY) if isinstance(launch, dict) else None
        if not url or not isinstance(mark, dict):
            continue
        language, share = mark.get("language"), mark.get("share")
        if not isinstance(language, str) or isinstance(share, bool) or not isinstance(share, (int, float)):
            continue
        if not math.isfinite(share) or not 0.0 <= share <= 1.0:
            continue
        out[str(url).rstrip("/")] = (language, float(share))
    return out


def apply(pools: list[Pool], language: str, canaries: Canaries | None, draw: float) -> list[Pool]:
    """``pools`` reordered for the canaries; ``draw`` is uniform in [0, 1) (the caller's random number)."""
    if not canaries:
        return pools
    marked = [p for p in pools if any(r.url in canaries for r in p.replicas)]
    if not marked:
        return pools
    rest = [p for p in pools if p not in marked]
    share = {id(p): max((canaries[r.url][1] for r in p.replicas
                         if r.url in canaries and canaries[r.url][0] == language), default=0.0) for p in marked}
    chosen = [p for p in marked if draw < share[id(p)]][:1]
    return chosen + rest + [p for p in marked if p not in chosen]
