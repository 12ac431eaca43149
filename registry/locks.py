"""Named leases in the registry (the ``locks`` table): one holder at a time, renewed by heartbeats, taken
over once expired.

`polyspec adapt` takes the lease "adapt" before it changes anything, so two adapt processes (two hosts, a
cron job beside a `--every` loop) never train, canary or swap at once. A holder that dies stops renewing
its lease; after ``ttl_s`` the lease is stale and the next process takes it over (an ``adapt-lock`` event
says whose it was). Every change runs in one write transaction: SQLite's ``BEGIN IMMEDIATE`` serialises
the read-modify-write; on Postgres the row is read ``FOR UPDATE`` (without it, every process that read a
stale lease before the first takeover committed took it over too: tests/scale/test_postgres_concurrency.py)
and two first inserts collide on the unique name, so the loser gets `LockHeld` either way.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from polyspec.core.errors import ConflictError
from polyspec.registry.errors import RegistryError
from polyspec.registry.schema import Event, Lock

MAX_TTL_S = 7 * 86400.0


class LockHeld(RegistryError, ConflictError):
    """Another live process holds the lease. ``holder`` and ``expires_at`` (Unix seconds) say who and until when."""

    def __init__(self, message: str, holder: str = "", expires_at: float = 0.0) -> None:
        super().__init__(message)
        self.holder, self.expires_at = holder, expires_at

    def details(self) -> dict[str, object]:
        return {"holder": self.holder, "expires_at": self.expires_at}


class LockLost(RegistryError, ConflictError):
    """The lease this process held expired and another process took it (or it was released meanwhile)."""


def holder_id(role: str = "adapt") -> str:
    """host:pid:role:random: unique per process and readable in `polyspec adapt status`."""
    return f"{socket.gethostname()}:{os.getpid()}:{role}:{uuid.uuid4().hex[:8]}"


def _check(name: str, holder: str, ttl_s: float) -> None:
    if not name or len(name) > 100:
        raise RegistryError(f"bad lock name {name!r}: 1 to 100 characters")
    if not holder or len(holder) > 250:
        raise RegistryError(f"bad lock holder {holder!r}: 1 to 250 characters")
    if not 0 < ttl_s <= MAX_TTL_S:  # also refuses NaN
        raise RegistryError(f"lock ttl must lie in (0, {MAX_TTL_S:g}] seconds, not {ttl_s!r}")


def _locked_row(session: Session, name: str) -> Lock | None:
    """The lease's row, locked until the transaction ends (Postgres; SQLite's write transaction already is)."""
    return session.scalars(select(Lock).where(Lock.name == name).with_for_update()).first()


def view(row: Lock, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    return {"name": row.name, "holder": row.holder, "acquired_at": row.acquired_at, "heartbeat_at": row.heartbeat_at,
            "expires_at": row.expires_at, "stale": row.expires_at <= now, "details": dict(row.details or {})}


def acquire(session: Session, name: str, holder: str, ttl_s: float, details: dict[str, Any] | None = None,
            now: float | None = None) -> dict[str, Any]:
    """Take the lease, or renew it when ``holder`` already has it; a stale lease is taken over (and the
    takeover is an event). Raises `LockHeld` while another holder's lease is live."""
    _check(name, holder, ttl_s)
    now = time.time() if now is None else now
    row = _locked_row(session, name)
    if row is None:
        row = Lock(name=name, holder=holder, acquired_at=now, heartbeat_at=now, expires_at=now + ttl_s,
                   details=dict(details or {}))
        session.add(row)
        try:
            session.flush()
        except IntegrityError:  # Postgres: another process inserted the same name first
            raise LockHeld(f"lock {name!r} was just taken by another process", "", now + ttl_s) from None
        return view(row, now)
    if row.holder != holder and row.expires_at > now:
        raise LockHeld(f"lock {name!r} is held by {row.holder} until {time.strftime('%H:%M:%S', time.localtime(row.expires_at))} "
                       f"(heartbeat {now - row.heartbeat_at:.0f} s ago)", row.holder, row.expires_at)
    if row.holder != holder:
        session.add(Event(kind=f"{name[:35]}-lock", subject=name, details={
            "what": "stale lock taken over", "who": holder, "previous_holder": row.holder,
            "expired_s_ago": round(now - row.expires_at, 1), "previous_details": dict(row.details or {})}))
        row.acquired_at = now
    row.holder, row.heartbeat_at, row.expires_at = holder, now, now + ttl_s
    row.details = dict(details or row.details or {})
    session.flush()
    return view(row, now)


def heartbeat(session: Session, name: str, holder: str, ttl_s: float, details: dict[str, Any] | None = None,
              now: float | None = None) -> dict[str, Any]:
    """Renew a lease this holder has; `LockLost` when it is no longer theirs (expired and taken, or released)."""
    _check(name, holder, ttl_s)
    now = time.time() if now is None else now
    row = _locked_row(session, name)
    if row is None or row.holder != holder:
        owner = "nobody" if row is None else row.holder
        raise LockLost(f"lock {name!r} is no longer held by {holder} (now: {owner})")
    row.heartbeat_at, row.expires_at = now, now + ttl_s
    if details is not None:
        row.details = dict(details)
    session.flush()
    return view(row, now)


def release(session: Session, name: str, holder: str) -> bool:
    """Give the lease up; False (nothing done) when this holder does not have it."""
    row = _locked_row(session, name)
    if row is None or row.holder != holder:
        return False
    session.delete(row)
    session.flush()
    return True


def list_locks(session: Session, now: float | None = None) -> list[dict[str, Any]]:
    return [view(row, now) for row in session.scalars(select(Lock).order_by(Lock.name))]
