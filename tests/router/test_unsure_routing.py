"""When language ID is unsure of a short text, the request goes to a draft that covers the likely labels, or to
the multilingual draft (router.decision.routing.unsure_pools), not to the default pool that a wrong guess would get."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polyspec.router.decision.classify import classify
from polyspec.router.config import RouterConfig
from polyspec.router.decision.routing import route, unsure_pools
from polyspec.router.runtime import RouterRuntime
from polyspec.router.table import MEMO_LIMIT, build_table

AMBIGUOUS = "Completa la"  # Spanish and Italian both write it: es at 0.22 over {en, es, it, ...}, it close behind
SERVED = ["en", "es", "it", "de", "fr"]


def fleet(multi: bool = True) -> list[dict[str, Any]]:
    def dep(name: str, draft: str | None, languages: list[str], mal: dict[str, float], default: bool = False) -> dict:
        return {"name": name, "url": f"http://{name}:8000", "draft": draft, "languages": languages,
                "is_default": default, "k": 3 if draft else None, "offline_mal": mal,
                "offline_acceptance": {lang: [0.5, 0.3, 0.1] for lang in mal}, "step_s": {1: 0.09}}

    deps = [dep("en", "en-base@1", ["en"], {"en": 2.55, "es": 2.10, "it": 2.08}, default=True),
            dep("es", "es@1", ["es"], {"es": 2.36, "it": 2.22}),
            dep("it", "it@1", ["it"], {"it": 2.31, "es": 2.25}),
            dep("plain", None, ["en"], {})]
    if multi:
        deps.append(dep("multi", "multi@1", ["de", "en", "es", "fr", "it"],
                        {"de": 3.07, "en": 2.14, "es": 3.06, "fr": 3.24, "it": 3.28}))
    return deps


def test_a_pool_serving_every_likely_label_comes_first_best_mean_acceptance_first() -> None:
    table = build_table(fleet(), "en")
    assert [p.draft for p in unsure_pools(table, ("es", "it"), "general")] == ["multi@1"]
    # one likely label: every speculating pool serving it, by its offline MAL there
    assert [p.draft for p in unsure_pools(table, ("es",), "general")] == ["multi@1", "es@1"]
    assert unsure_pools(table, ("es", "it"), "general", serving={"http://es:8000"}) == []


def test_without_a_covering_pool_the_broadest_draft_serves_and_otherwise_nothing_changes() -> None:
    table = build_table(fleet(), "en")
    assert [p.draft for p in unsure_pools(table, ("pt", "es"), "general")] == ["multi@1"]  # no pool serves pt
    assert unsure_pools(table, ("pt",), "general") == []  # nobody serves it: the default pools, as before
    single = build_table(fleet(multi=False), "en")
    assert unsure_pools(single, ("es", "it"), "general") == []  # specialists only: no guess is made for the text
    assert unsure_pools(single, ("es", "it"), "general") is not unsure_pools(single, ("es", "it"), "general")  # copies


def test_an_unsure_short_text_keeps_its_likely_labels_in_the_decision() -> None:
    body = {"messages": [{"role": "user", "content": AMBIGUOUS}]}
    decision = classify(body, "chat", {}, {}, SERVED, "en", 0.4, 500)
    assert decision.source == "fallback" and decision.language == "en" and decision.stats_language == "und"
    assert set(decision.likely) == {"es", "it"}
    sure = classify({"messages": [{"role": "user", "content": "Tenemos una pregunta"}]}, "chat", {}, {}, SERVED,
                    "en", 0.4, 500)
    assert sure.source == "langid" and sure.likely == ()


@pytest.mark.parametrize("policy", ["speed", "mal"])
def test_route_sends_the_unsure_text_to_the_covering_draft_with_the_default_after_it(policy: str) -> None:
    rt = RouterRuntime(RouterConfig(router_id="t", default_language="en", language_threshold=0.4, policy=policy))
    rt.table = build_table(fleet(), "en")
    raw = json.dumps({"model": "polyspec", "messages": [{"role": "user", "content": AMBIGUOUS}]}).encode()
    routing = route(rt, raw, {}, "chat", serving_of=lambda rt, model: None)
    drafts = [p.draft for p in routing.pools]
    assert routing.decision.source == "fallback"
    assert drafts[0] == "multi@1" and "en-base@1" in drafts[1:]  # the default pool stays for failover
    confident = json.dumps({"model": "polyspec", "messages": [{"role": "user", "content": "Tenemos una pregunta"}]})
    routing = route(rt, confident.encode(), {}, "chat", serving_of=lambda rt, model: None)
    assert routing.decision.language == "es" and routing.decision.likely == ()


def test_hostile_labels_are_bounded_by_the_cache() -> None:
    table = build_table(fleet(), "en")
    for i in range(5000):
        unsure_pools(table, (f"x{i}",), "general")
    assert len(table.memo.unsure) <= MEMO_LIMIT == 4096
