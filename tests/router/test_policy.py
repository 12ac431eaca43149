"""Routing policy against a real SQLite registry populated through the registry API."""

from __future__ import annotations

import asyncio

import pytest

from polyspec.router.engine.backends import Backends
from polyspec.router.decision.policy import blended_mal, candidate_pools, plan_attempts
from polyspec.router.source import RegistrySource
from polyspec.router.table import build_table
from polyspec.router.telemetry import merge_rows
from tests.router.conftest import add_draft, router_config


@pytest.fixture()
def fr_setup(registry, fake_verifier, fake_draft_dir):
    """fr/code pool, two fr/general pools (offline MAL 1.5 and 1.8), an en default pool with two replicas.

    A verifier description and a structural draft are enough: routing reads registry rows, never weights."""
    v, base_draft_dir = fake_verifier.name, fake_draft_dir
    refs = {
        "fr-code": add_draft(registry, base_draft_dir, v, "fr-code", ["fr"], {"fr": 1.4}, domain="code"),
        "fr-a": add_draft(registry, base_draft_dir, v, "fr-a", ["fr"], {"fr": 1.5}),
        "fr-b": add_draft(registry, base_draft_dir, v, "fr-b", ["fr"], {"fr": 1.8}),
        "en": add_draft(registry, base_draft_dir, v, "en", ["en"], {"en": 2.0}),
    }
    registry.deploy(refs["fr-code"], name="fr-code-1", url="http://127.0.0.1:9001", domain="code")
    registry.deploy(refs["fr-a"], name="fr-a-1", url="http://127.0.0.1:9002")
    registry.deploy(refs["fr-b"], name="fr-b-1", url="http://127.0.0.1:9003")
    registry.deploy(refs["en"], name="en-1", url="http://127.0.0.1:9004", default=True)
    registry.deploy(refs["en"], name="en-2", url="http://127.0.0.1:9005")
    return refs


def _unreachable(tmp_path) -> RegistrySource:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the registry's directory should be")
    return RegistrySource(f"sqlite:///{blocker}/registry.db")


def _table(registry_url: str):
    return build_table(RegistrySource(registry_url).deployments(), "en")


def test_pools_group_replicas_and_carry_offline_mal(registry_url, fr_setup):
    table = _table(registry_url)
    assert len(table.pools) == 4
    en_pool = next(p for p in table.pools if p.draft == fr_setup["en"])
    assert [r.name for r in en_pool.replicas] == ["en-1", "en-2"]
    assert en_pool.is_default and en_pool.offline_mal == {"en": pytest.approx(2.0)}
    assert table.languages == {"en", "fr"}


def test_fallback_order_language_domain_then_general_then_default(registry_url, fr_setup):
    table = _table(registry_url)
    code = [p.draft for p in candidate_pools(table, "fr", "code", {}, 2000)]
    assert code == [fr_setup["fr-code"], fr_setup["fr-b"], fr_setup["fr-a"], fr_setup["en"]]
    assert [p.draft for p in candidate_pools(table, "de", "code", {}, 2000)] == [fr_setup["en"]]
    assert [p.draft for p in candidate_pools(table, "en", "general", {}, 2000)] == [fr_setup["en"]]


def test_live_telemetry_overtakes_offline_mal(registry, registry_url, fr_setup):
    table = _table(registry_url)
    pools = {p.draft: p for p in table.pools}
    # fr-b is best offline (1.8 > 1.5) ...
    assert candidate_pools(table, "fr", "general", {}, 2000)[0].draft == fr_setup["fr-b"]
    # ... but live traffic (persisted by two routers, additively) says it accepts little on French.
    for router_id in ("r1", "r2"):
        registry.record_live_stats(router_id, [{"language": "fr", "domain": "general", "draft_name": fr_setup["fr-b"],
                                                "requests": 10, "num_spec_steps": 3000, "num_draft_tokens": 9000,
                                                "num_accepted_tokens": 600, "accepted_per_pos": [400, 150, 50]}])
    live = merge_rows(RegistrySource(registry_url).live_stats())
    row = live[("fr", "general", fr_setup["fr-b"])]
    assert row.num_spec_steps == 6000 and row.accepted_per_pos == (800, 300, 100)
    # (2000 * 1.8 + 6000 * (1 + 1200/6000)) / 8000
    assert blended_mal(pools[fr_setup["fr-b"]], "fr", "general", live, 2000) == pytest.approx(1.35)
    assert candidate_pools(table, "fr", "general", live, 2000)[0].draft == fr_setup["fr-a"]
    # With a heavier offline prior the offline figure still wins.
    assert candidate_pools(table, "fr", "general", live, 100_000)[0].draft == fr_setup["fr-b"]


def test_least_in_flight_and_healthy_only(registry_url, fr_setup):
    table = _table(registry_url)
    backends = Backends(router_config(registry_url, fail_threshold=2, recover_threshold=2))
    backends.sync([(r.name, r.url) for r in table.replicas()])
    pools = candidate_pools(table, "en", "general", {}, 2000)
    en1, en2 = "http://127.0.0.1:9004", "http://127.0.0.1:9005"
    backends.acquire(en1)
    plan = plan_attempts(pools, backends.is_healthy, backends.in_flight, 3)
    assert [t.replica.url for t in plan] == [en2, en1]
    backends.release(en1)
    backends.acquire(en2)
    backends.acquire(en2)
    assert plan_attempts(pools, backends.is_healthy, backends.in_flight, 1)[0].replica.url == en1
    # Hysteresis: one failure is not enough to mark a replica down; two are; two successes bring it back.
    backends.record_failure(en1, "boom")
    assert backends.is_healthy(en1)
    backends.record_failure(en1, "boom")
    assert not backends.is_healthy(en1)
    assert [t.replica.url for t in plan_attempts(pools, backends.is_healthy, backends.in_flight, 3)] == [en2]
    backends.record_success(en1)
    assert not backends.is_healthy(en1)
    backends.record_success(en1)
    assert backends.is_healthy(en1)
    backends.record_failure(en1, "x")
    backends.record_failure(en1, "x")
    backends.record_failure(en2, "x")
    backends.record_failure(en2, "x")
    assert plan_attempts(pools, backends.is_healthy, backends.in_flight, 3) == []
    asyncio.run(backends.aclose())


def test_fallback_pool_used_when_first_pool_is_down(registry_url, fr_setup):
    table = _table(registry_url)
    backends = Backends(router_config(registry_url))
    backends.sync([(r.name, r.url) for r in table.replicas()])
    backends.record_failure("http://127.0.0.1:9001", "down")  # fr-code's only replica
    pools = candidate_pools(table, "fr", "code", {}, 2000)
    plan = plan_attempts(pools, backends.is_healthy, backends.in_flight, 2)
    assert [t.replica.name for t in plan] == ["fr-b-1", "fr-a-1"]
    asyncio.run(backends.aclose())


def test_runtime_refresh_keeps_last_table_when_registry_unreachable(registry, registry_url, fr_setup, tmp_path):
    from polyspec.router.runtime import RouterRuntime

    async def scenario() -> None:
        runtime = RouterRuntime(router_config(registry_url, health_timeout_s=0.2))
        assert (await runtime.refresh())["ok"]
        assert len(runtime.table.pools) == 4
        registry.undeploy("fr-code-1")  # an admin refresh picks the change up
        assert (await runtime.refresh())["ok"] and len(runtime.table.pools) == 3
        runtime.source = _unreachable(tmp_path)
        result = await runtime.refresh()
        assert not result["ok"] and runtime.last_refresh_error
        assert len(runtime.table.pools) == 3  # still serving from the last table
        await runtime.backends.aclose()

    asyncio.run(scenario())


def test_flush_is_additive_and_survives_failure(registry, registry_url, fr_setup, tmp_path):
    from polyspec.router.runtime import RouterRuntime

    spec = {"acceptance_histogram": [5, 3, 2, 0], "num_spec_steps": 10, "num_draft_tokens": 30,
            "num_accepted_draft_tokens": 7}
    key = ("fr", "general", fr_setup["fr-a"])

    async def scenario() -> None:
        runtime = RouterRuntime(router_config(registry_url))
        runtime.telemetry.observe_acceptance(key, spec, 12)
        assert await runtime.flush()
        good_source = runtime.source
        runtime.source = _unreachable(tmp_path)
        runtime.telemetry.observe_acceptance(key, spec, 12)
        assert not await runtime.flush()  # kept for the next flush
        runtime.source = good_source
        assert await runtime.flush()
        await runtime.backends.aclose()

    asyncio.run(scenario())
    rows = {(r.language, r.domain, r.draft_name): r for r in registry.live_stats()}
    row = rows[key]
    assert (row.requests, row.num_spec_steps, row.num_draft_tokens, row.num_accepted_tokens) == (2, 20, 60, 14)
    assert list(row.accepted_per_pos) == [10, 4, 0] and row.completion_tokens == 24
