"""Several routers (and adapt processes) on one Postgres registry: the shared rows they write concurrently.

Live stats are increments, so writers that share a row (two routers left with the same router_id, the
default `hostname` on one host) must never lose one another's counts; the adaptation lease must have one
holder however many processes race to take over a stale one. Threads with their own connections stand in
for processes: what matters is concurrent transactions on the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

WRITERS = 8


def _race(n: int, action: Callable[[int], Any]) -> list[Any]:
    """Run ``action(i)`` in n threads released together; each result, or the exception it raised."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = action(i)
        except Exception as exc:  # noqa: BLE001 - returned to the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.fixture()
def pg_reg(pg_url: str):
    from polyspec.registry import open_registry
    from polyspec.registry.schema import LiveStat, Lock

    reg = open_registry(pg_url)
    with reg.session(write=True) as s:  # the cluster is per module: start every test from empty tables
        s.query(LiveStat).delete()
        s.query(Lock).delete()
    yield reg
    reg.close()


def test_live_stats_of_concurrent_writers_add_up_on_one_row(pg_reg) -> None:
    rounds = 15

    def flush(i: int) -> None:
        for _ in range(rounds):  # the same (router_id, language, domain, draft) row for every writer
            pg_reg.record_live_stats("same-host", [{"language": "fr", "draft_name": "fr@1", "requests": 1,
                                                    "num_spec_steps": 2, "accepted_per_pos": [1, 1],
                                                    "generation_s": 0.5}])

    assert _race(WRITERS, flush) == [None] * WRITERS
    (row,) = pg_reg.live_stats()
    assert (row.requests, row.num_spec_steps, row.accepted_per_pos) == (WRITERS * rounds, 2 * WRITERS * rounds,
                                                                       [WRITERS * rounds] * 2)
    assert row.generation_s == pytest.approx(0.5 * WRITERS * rounds)


def test_live_stats_of_many_routers_sum_and_stay_per_router(pg_reg) -> None:
    def flush(i: int) -> None:
        for _ in range(5):
            pg_reg.record_live_stats(f"r{i % 3}", [{"language": "en", "draft_name": "en@1", "requests": 2}])

    assert _race(WRITERS, flush) == [None] * WRITERS
    assert [s.requests for s in pg_reg.live_stats()] == [WRITERS * 10]
    per_router = [sum(s.requests for s in pg_reg.live_stats(router_id=f"r{k}")) for k in range(3)]
    assert per_router == [10 * sum(1 for i in range(WRITERS) if i % 3 == k) for k in range(3)]


def test_a_stale_adaptation_lease_has_exactly_one_new_holder(pg_reg) -> None:
    from polyspec.registry.locks import LockHeld

    from polyspec.registry.schema import Lock

    pg_reg.acquire_lock("adapt", "dead-process", ttl_s=60)
    for _ in range(5):
        with pg_reg.session(write=True) as s:  # whoever holds it now dies: its lease expired long ago
            s.query(Lock).filter_by(name="adapt").update({"expires_at": time.time() - 100, "holder": "dead-process"})
        results = _race(WRITERS, lambda i: pg_reg.acquire_lock("adapt", f"adapter-{i}", ttl_s=60))
        winners = [r for r in results if isinstance(r, dict)]
        assert len(winners) == 1, results
        assert all(isinstance(r, LockHeld) for r in results if not isinstance(r, dict)), results
        assert pg_reg.locks()[0]["holder"] == winners[0]["holder"]


def test_a_free_adaptation_lease_has_exactly_one_first_holder(pg_reg) -> None:
    from polyspec.registry.locks import LockHeld

    results = _race(WRITERS, lambda i: pg_reg.acquire_lock("adapt", f"adapter-{i}", ttl_s=60))
    winners = [r for r in results if isinstance(r, dict)]
    assert len(winners) == 1 and all(isinstance(r, LockHeld) for r in results if r not in winners), results
