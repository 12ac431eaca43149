"""The registry side of `polyspec adapt`: its audit trail (events), its observations of live traffic, and
the small state changes it makes to deployments and drafts.

Every step of an adaptation is one event, subject = the language, with ``who`` (the adapt process),
``attempt`` (one id per adaptation, so a timeline groups its steps), ``status`` and the figures and
checksums behind it:

- ``adapt-trigger``: why a language was picked (observed vs target, traffic, new captured prompts);
- ``adapt-training``: data set (train and held-out files with their sha256), run id, mode, outcome;
- ``adapt-gate``: every comparison of the candidate with the serving draft, passed or not;
- ``adapt-canary``: the candidate engine, its share of traffic, the live comparison and its test;
- ``adapt-swap`` / ``adapt-rollback``: what moved, before/after figures, engines drained and stopped;
- ``adapt-failed``: a step that could not run (engine did not start, disk full, registry locked...).

``adapt-observe`` events (subject "*") hold cumulative live counters per (language, domain) at each cycle,
so a trigger can look at a window of traffic rather than at everything since the registry began.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from polyspec.registry.deployments import views
from polyspec.registry.errors import NotFound, RegistryError
from polyspec.registry.records import AdaptEventRecord, DeploymentView
from polyspec.registry.schema import Deployment, Draft, Event

PREFIX = "adapt-"
STEPS = ("trigger", "training", "gate", "canary", "swap", "rollback", "failed", "observe", "lock")
KINDS = tuple(PREFIX + s for s in STEPS)
OBSERVE_SUBJECT = "*"
_DRAFT_STATUSES = ("candidate", "active", "retired")


def record(session: Session, step: str, language: str, /, *, who: str, attempt: str | None = None,
           status: str = "done", **details: Any) -> AdaptEventRecord:
    """Add one audit event of adaptation ``step`` for ``language``."""
    if step not in STEPS:
        raise RegistryError(f"unknown adaptation step {step!r}; steps: {', '.join(STEPS)}")
    if not language or len(language) > 250:
        raise RegistryError(f"bad adaptation subject {language!r}")
    row = Event(kind=PREFIX + step, subject=language, details={
        "who": who, "attempt": attempt, "status": status, "at": round(time.time(), 3), **details})
    session.add(row)
    session.flush()
    return AdaptEventRecord.of(row)


def events(session: Session, language: str | None = None, *, steps: Iterable[str] | None = None,
           attempt: str | None = None, limit: int = 1000) -> list[AdaptEventRecord]:
    """Adaptation events, oldest first (the newest ``limit`` of them)."""
    kinds = [PREFIX + s for s in steps] if steps is not None else [k for k in KINDS if k != PREFIX + "observe"]
    query = select(Event).where(Event.kind.in_(kinds)).order_by(Event.id.desc()).limit(max(1, limit))
    if language is not None:
        query = query.where(Event.subject == language)
    rows = [AdaptEventRecord.of(r) for r in session.scalars(query)]
    if attempt is not None:
        rows = [r for r in rows if r.attempt == attempt]
    return rows[::-1]


def last(session: Session, language: str, step: str, *, status: str | None = None) -> AdaptEventRecord | None:
    """The newest ``step`` event of ``language`` (with that status, when given)."""
    query = select(Event).where(Event.kind == PREFIX + step, Event.subject == language).order_by(Event.id.desc())
    for row in session.scalars(query.limit(200)):
        rec = AdaptEventRecord.of(row)
        if status is None or rec.status == status:
            return rec
    return None


def observe(session: Session, counters: Mapping[str, Mapping[str, float]], *, who: str) -> None:
    """Store one snapshot of cumulative live counters per "language|domain"."""
    session.add(Event(kind=PREFIX + "observe", subject=OBSERVE_SUBJECT, details={
        "who": who, "at": round(time.time(), 3), "counters": {k: dict(v) for k, v in counters.items()}}))
    session.flush()


def observation_before(session: Session, at: float, *, scan: int = 500) -> dict[str, Any] | None:
    """The newest snapshot taken at or before ``at`` (Unix seconds), or None."""
    query = select(Event).where(Event.kind == PREFIX + "observe").order_by(Event.id.desc()).limit(scan)
    for row in session.scalars(query):
        details = dict(row.details or {})
        if float(details.get("at", 0.0)) <= at:
            return details
    return None


def update_launch(session: Session, deployment: str, *, set_keys: Mapping[str, Any] | None = None,
                  remove: Iterable[str] = (), who: str = "adapt") -> DeploymentView:
    """Change keys of an active deployment's launch spec (the canary share, the engine adapt started) in one
    transaction; a ``launch`` event records what changed."""
    row = session.scalars(select(Deployment).where(Deployment.name == deployment,
                                                   Deployment.status == "active")).first()
    if row is None:
        raise NotFound(f"no active deployment named {deployment!r}")
    launch = {k: v for k, v in (row.launch or {}).items() if k not in set(remove)}
    launch.update(dict(set_keys or {}))
    row.launch = launch
    session.add(Event(kind="launch", subject=deployment, details={
        "who": who, "set": dict(set_keys or {}), "removed": sorted(set(remove))}))
    session.flush()
    return next(v for v in views(session) if v.name == deployment)


def set_draft_status(session: Session, name: str, version: int, status: str, *, who: str, why: str) -> None:
    """Move a draft between candidate, active and retired outside the promotion gate (a rollback restores the
    draft a swap replaced; a rolled-back candidate is retired), with a ``draft-status`` event."""
    if status not in _DRAFT_STATUSES:
        raise RegistryError(f"status must be one of {', '.join(_DRAFT_STATUSES)}, not {status!r}")
    row = session.scalars(select(Draft).where(Draft.name == name, Draft.version == version)).first()
    if row is None:
        raise NotFound(f"no draft {name}@{version} in the registry")
    if status == "retired" and any(d.status == "active" for d in row.deployments):
        raise RegistryError(f"{name}@{version} is still deployed; undeploy it before retiring it")
    before, row.status = row.status, status
    session.add(Event(kind="draft-status", subject=f"{name}@{version}", details={
        "who": who, "from": before, "to": status, "why": why}))
    session.flush()


def summary(event: Any) -> str:
    """One line of the figures that matter for each step."""
    d = event.details
    if event.step == "trigger":
        return "; ".join(t.get("why", "") for t in d.get("triggers", []))
    if event.step == "training":
        data = d.get("dataset") or {}
        return (f"run {d.get('run_id')}: {data.get('train')} train / {data.get('heldout')} held out "
                f"(sha256 {str(data.get('train_sha256'))[:12]} / {str(data.get('heldout_sha256'))[:12]})"
                + (f" -> {d['draft']}" if d.get("draft") else "") + (f": {d['reason']}" if d.get("reason") else ""))
    if event.step == "gate":
        rows = [c for c in d.get("comparisons", []) if c.get("change") is not None]
        return "; ".join(f"{c['language']} {c['benchmark']} {c['subset']}: {c['before']}->{c['after']}" for c in rows)
    if event.step in ("canary", "swap", "rollback"):
        before, after = d.get("before") or (d.get("arms") or {}).get("old"), d.get("after") or (d.get("arms") or {}).get("candidate")
        figs = (f"tokens/s {figure((before or {}).get('tokens_per_s'))} -> {figure((after or {}).get('tokens_per_s'))}, "
                f"tokens/step {figure((before or {}).get('tokens_per_step'), 3)} -> {figure((after or {}).get('tokens_per_step'), 3)}"
                if before or after else "")
        return "; ".join(x for x in (figs, "; ".join(d.get("reasons", [])), d.get("why", "")) if x)
    return str(d.get("reason", ""))


def figure(value: float | None, digits: int = 1) -> str:
    """A figure for a table cell: '-' when missing."""
    return "-" if value is None else f"{value:.{digits}f}"
