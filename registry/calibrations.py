"""Engine calibrations: the step-cost curve of each deployment (core.speed), as `polyspec engines calibrate`
measured it. The router reads the newest point per (deployment, batch size) with the deployments."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from polyspec.registry.errors import NotFound, RegistryError
from polyspec.registry.records import CalibrationRecord
from polyspec.registry.schema import Deployment, EngineCalibration, Event

MAX_BATCH = 4096
LAUNCHED_K = "launched_k"  # in Deployment.launch while `polyspec up` runs it: the k its engine started with
# Launch knobs that change an engine's step time (the fleet's others name the engine: port, served name).
SPEED_KNOBS = ("max_model_len", "kv_cache_gib", "dtype", "cpu_bind", "threads", "extra_args", "env")


def served_k(row: Deployment) -> int:
    """The k a deployment's engine drafts: the one `polyspec up` started it with (``k: auto`` resolved),
    else the launch spec's, else the draft's own; 0 without a draft."""
    if row.draft is None:
        return 0
    launch = row.launch or {}
    for key in (LAUNCHED_K, "k"):
        value = launch.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return int(row.draft.k or 3)


def url_host(url: str | None) -> str | None:
    """The host of an engine URL; None without one, or when the URL does not parse ("http://[bad")."""
    try:
        return urlsplit(url).hostname if url else None
    except ValueError:
        return None


def engine_shape(row: Deployment, k: int) -> str | None:
    """What an engine's step time depends on: the host it runs on, the verifier, the draft's k and vocabulary
    (the draft's weights and languages do not matter) and the launch knobs that change speed. Engines of one
    shape share one step model (core.speed.shared_curves): five engines of one shape on one host calibrated far
    apart at batch 1, a spread that is noise, and the speed policy routed by it (docs/speed.md, Figures).
    None (a shape of its own) without a URL or a host in it: the host is what ties engines to one machine. A
    URL that does not parse (an imported registry may hold one) gets None too, never an error: every view of
    the registry builds the shapes."""
    host = url_host(row.url)
    if not host:
        return None
    draft = row.draft
    verifier = draft.verifier_id if draft is not None else row.verifier_id
    launch = row.launch or {}
    parts = [host, verifier, k, draft.draft_vocab_size if draft is not None else None,
             {key: launch.get(key) for key in SPEED_KNOBS if launch.get(key) is not None}]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _number(point: Mapping[str, Any], name: str, *, positive: bool = True) -> float:
    value = point.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RegistryError(f"calibration point: {name} must be a finite number, not {value!r}")
    if value < 0 or (positive and value == 0):
        raise RegistryError(f"calibration point: {name} must be {'positive' if positive else 'non-negative'} ({value})")
    return float(value)


def record(session: Session, deployment: str, points: Iterable[Mapping[str, Any]], *, who: str = "calibrate") -> int:
    """Store one calibration run (one point per batch size) of an active deployment; an event notes it."""
    row = session.scalars(select(Deployment).where(Deployment.name == deployment, Deployment.status == "active")).first()
    if row is None:
        raise NotFound(f"no active deployment named {deployment!r}")
    draft = f"{row.draft.name}@{row.draft.version}" if row.draft is not None else "none"
    k = served_k(row)
    stored = []
    for point in points:
        batch = int(_number(point, "batch_size"))
        if batch > MAX_BATCH:
            raise RegistryError(f"calibration point: batch_size {batch} is above {MAX_BATCH}")
        stored.append(EngineCalibration(
            deployment=deployment, url=row.url or "", draft_name=draft, k=k,
            batch_size=batch, step_s=_number(point, "step_s"), tokens_per_s=_number(point, "tokens_per_s"),
            requests=int(_number(point, "requests")), details=dict(point.get("details") or {}),
        ))
    if not stored:
        raise RegistryError("a calibration needs at least one point")
    session.add_all(stored)
    session.add(Event(kind="calibrate", subject=deployment, details={
        "who": who, "draft": draft, "k": stored[0].k,
        "points": [{"batch_size": p.batch_size, "step_s": p.step_s, "tokens_per_s": p.tokens_per_s} for p in stored]}))
    session.flush()
    return len(stored)


def latest(session: Session, deployment: str | None = None) -> list[CalibrationRecord]:
    """The newest point per (deployment, batch size), sorted by deployment and batch size."""
    query = select(EngineCalibration).order_by(EngineCalibration.id)
    if deployment is not None:
        query = query.where(EngineCalibration.deployment == deployment)
    newest: dict[tuple[str, int], EngineCalibration] = {}
    for row in session.scalars(query):
        newest[(row.deployment, row.batch_size)] = row  # ids rise with time: the last one wins
    return [CalibrationRecord.of(newest[key]) for key in sorted(newest)]


def step_costs(session: Session, deployment: str, draft: str, k: int) -> dict[int, float]:
    """Batch size -> step seconds for one deployment, from points measured with its current draft and k
    (a deployment re-pointed to another draft is uncalibrated until calibrated again)."""
    return {p.batch_size: p.step_s for p in latest(session, deployment) if p.draft_name == draft and p.k == k}
