"""The routing table: built once per registry change, with every lookup the hot path makes derived then."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from polyspec.core.domains import DOMAINS
from polyspec.core.langid import allowed_labels
from polyspec.router.config import RouterConfig
from polyspec.router.runtime import RouterRuntime
from polyspec.router.table import build_table
from tests.router.test_unsure_routing import fleet


def test_the_table_derives_its_lookups_once() -> None:
    table = build_table(fleet(), "en", {"http://it:8000": ("it", 0.25)})
    assert table.languages == {"en", "es", "it", "de", "fr"}
    assert table.known_languages == table.languages and table.langid_labels == allowed_labels(table.languages)
    assert table.domains == {"general"} and table.pin_domains == frozenset(DOMAINS) | {"general"}
    assert [p.draft for p in table.pools_for("it", "general")] == ["it@1", "multi@1"]
    assert table.pools_for("it", "code") == () and table.pools_for("xx", "general") == ()
    assert [p.draft for p in table.default_pools] == ["en-base@1"]
    assert [p.draft for p in table.no_spec_pools] == ["none"]
    assert table.canaries == {"http://it:8000": ("it", 0.25)}
    assert len(table.replicas()) == 5


class _Source:
    def __init__(self, deployments: list[dict[str, Any]]) -> None:
        self.deployments_now = deployments

    def deployments(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.deployments_now)  # new objects each time, as a registry read gives

    def live_stats(self) -> list[Any]:
        return []

    def record_live_stats(self, router_id: str, rows: Any) -> None:
        pass


def test_a_refresh_keeps_the_table_until_the_registry_changes() -> None:
    deps = fleet()
    for dep in deps:
        dep["url"] = dep["url"].replace(f"{dep['name']}:8000", "127.0.0.1:9")  # refused at once: probes fail fast
        dep["url"] += f"/{dep['name']}"
    source = _Source(deps)
    rt = RouterRuntime(RouterConfig(router_id="t", default_language="en", health_timeout_s=1), source)

    async def main() -> None:
        assert (await rt.refresh(wait_s=30))["ok"]
        first = rt.table
        first.memo.unsure[(("es", "it"), "general")] = ()
        assert (await rt.refresh(wait_s=30))["ok"] and rt.table is first and first.memo.unsure
        source.deployments_now[1]["offline_mal"]["es"] = 2.5  # a new evaluation
        assert (await rt.refresh(wait_s=30))["ok"] and rt.table is not first and not rt.table.memo.unsure
        assert rt.table.pools_for("es", "general")[0].offline_mal["es"] == 2.5
        await rt.backends.aclose()

    asyncio.run(main())
