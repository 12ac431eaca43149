"""The registry lock: one holder at a time, heartbeats, stale leases taken over (with an event), bad input
refused, and mutual exclusion across processes on one SQLite file."""

from __future__ import annotations

import math
import multiprocessing as mp
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from polyspec.registry.errors import RegistryError
from polyspec.registry.locks import LockHeld, LockLost


@pytest.fixture()
def reg(registry_url: str):
    from polyspec.registry import open_registry

    registry = open_registry(registry_url)
    yield registry
    registry.close()


def test_one_holder_at_a_time(reg) -> None:
    got = reg.acquire_lock("adapt", "a", 60, {"doing": "train it"})
    assert got["holder"] == "a" and not got["stale"] and got["details"] == {"doing": "train it"}
    with pytest.raises(LockHeld) as info:
        reg.acquire_lock("adapt", "b", 60)
    assert info.value.holder == "a" and info.value.expires_at == pytest.approx(got["expires_at"])
    assert info.value.exit_code == 4
    again = reg.acquire_lock("adapt", "a", 60)  # the holder renews
    assert again["acquired_at"] == got["acquired_at"] and again["expires_at"] >= got["expires_at"]
    assert reg.heartbeat_lock("adapt", "a", 60)["holder"] == "a"
    with pytest.raises(LockLost):
        reg.heartbeat_lock("adapt", "b", 60)
    assert reg.release_lock("adapt", "b") is False  # not b's to release
    assert reg.release_lock("adapt", "a") is True
    assert reg.locks() == []
    assert reg.acquire_lock("adapt", "b", 60)["holder"] == "b"


def test_stale_lease_is_taken_over_with_an_event(reg) -> None:
    from polyspec.registry.locks import acquire

    with reg.session(write=True) as s:
        acquire(s, "adapt", "dead-process", 5, {"step": "canary"}, now=1000.0)
    taken = reg.acquire_lock("adapt", "alive", 60)
    assert taken["holder"] == "alive"
    event = reg.events(5)[0]
    assert event.kind == "adapt-lock" and event.details["previous_holder"] == "dead-process"
    assert event.details["previous_details"] == {"step": "canary"} and event.details["who"] == "alive"
    with pytest.raises(LockLost):  # the dead holder, back, learns it lost the lease
        reg.heartbeat_lock("adapt", "dead-process", 60)


@pytest.mark.parametrize("name, holder, ttl", [
    ("", "a", 10), ("x" * 101, "a", 10), ("adapt", "", 10), ("adapt", "h" * 251, 10),
    ("adapt", "a", 0), ("adapt", "a", -1), ("adapt", "a", math.nan), ("adapt", "a", 1e12),
])
def test_bad_lock_input_is_refused(reg, name: str, holder: str, ttl: float) -> None:
    with pytest.raises(RegistryError):
        reg.acquire_lock(name, holder, ttl)
    assert reg.locks() == []


def _contender(url: str, me: int, start, results) -> None:  # noqa: ANN001 - mp.Event, mp.Queue
    from polyspec.registry import open_registry
    from polyspec.registry.locks import LockHeld

    reg = open_registry(url)
    start.wait(30)
    try:
        reg.acquire_lock("adapt", f"p{me}", 60)
        results.put(me)
    except LockHeld:
        results.put(-1)
    reg.close()


def test_processes_racing_for_the_lock_get_exactly_one_winner(reg, registry_url: str) -> None:
    ctx = mp.get_context("fork")  # separate processes without importing the test module again (spawn: 8 s)
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_contender, args=(registry_url, i, start, results)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    outcomes = sorted(results.get(timeout=5) for _ in procs)
    assert outcomes.count(-1) == 3
    winner = [o for o in outcomes if o >= 0][0]
    assert [lock["holder"] for lock in reg.locks()] == [f"p{winner}"]


def test_migration_0004_adds_locks_and_keeps_data(tmp_path: Path) -> None:
    from alembic import command

    from polyspec.registry import db, open_registry

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = db.make_engine(url)
    with db.write_engine(engine).begin() as conn:
        command.upgrade(db.alembic_config(conn), "0003")
        conn.execute(text("INSERT INTO events (kind, subject, details, created_at) "
                          "VALUES ('deploy', 'x', '{}', '2026-01-01')"))
    engine.dispose()
    with open_registry(url) as reg:  # migrates to head
        assert [e.subject for e in reg.events()] == ["x"]
        reg.acquire_lock("adapt", "a", 10)
    with create_engine(url).begin() as conn:
        command.downgrade(db.alembic_config(conn), "0003")
        tables = set(conn.execute(text("SELECT name FROM sqlite_master WHERE type='table'")).scalars())
    assert "locks" not in tables and "events" in tables
