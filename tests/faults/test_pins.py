"""Pinned languages and domains are normalised, validated and counted in a bounded set.

Pins were free text: 3,000 requests made /metrics 7.7 MB, added 3,008 registry rows and blocked a
scrape for 2.7 s. Now a language pin is an ISO 639 code (``fra``, ``FR``, ``fr-CA`` all mean ``fr``), a
domain pin is a domain the router knows, anything else is a 400, and metric labels and live-stat rows
only ever name the routing table's languages, ``und`` or ``other``.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import pycountry
import pytest

from tests.router.conftest import SERVED, chat, openai_error, serve_router
from tests.router.fakes import BrokenEngine

HI = {"model": "polyspec", "max_tokens": 1, "messages": [{"role": "user", "content": "Hello there, how are you?"}]}


@pytest.fixture()
def en_fr(registry):
    """Two failing engines: en (default pool) and fr. Which one a request reaches shows where it was routed."""
    with BrokenEngine("error500") as en, BrokenEngine("error500") as fr:
        registry.deploy(None, name="en-engine", url=en.url, languages=["en"], default=True)
        registry.deploy(None, name="fr-engine", url=fr.url, languages=["fr"])
        yield en, fr


def _label_values(metrics: str, label: str) -> set[str]:
    return set(re.findall(rf'{label}="([^"]*)"', metrics))


@pytest.mark.parametrize("pin", ["fr", "FR", "fra", "fre", "fr-CA", "fr_FR", "Fr"])
def test_language_pins_are_normalised(en_fr, registry_url, pin):
    en, fr = en_fr
    with serve_router(registry_url, fail_threshold=100, max_attempts=1) as router:
        openai_error(chat(router.url, "Hello there", headers={"X-Polyspec-Language": pin}), 502)
        body_pin = httpx.post(f"{router.url}/v1/chat/completions", json={**HI, "polyspec": {"language": pin}})
        openai_error(body_pin, 502)
        metrics = httpx.get(f"{router.url}/metrics").text
    assert (fr.completion_requests, en.completion_requests) == (2, 0)
    assert 'language="fr"' in metrics and pin.strip() not in _label_values(metrics, "language") - {"fr"}


@pytest.mark.parametrize("pins, header, param", [
    ({"language": 123}, None, "polyspec.language"),
    ({"language": ["fr"]}, None, "polyspec.language"),
    ({"language": {"code": "fr"}}, None, "polyspec.language"),
    ({"domain": 7}, None, "polyspec.domain"),
    ("fr", None, "polyspec"),  # the router's field must be an object
    ({"language": "xx"}, None, "polyspec.language"),  # well-formed, but no ISO 639 language
    ({"language": "français"}, None, "polyspec.language"),
    ({"domain": "legal"}, None, "polyspec.domain"),  # no pool has it, and it is not built in
    ({}, {"X-Polyspec-Language": "qqq"}, "X-Polyspec-Language"),
    ({}, {"X-Polyspec-Language": "f" * 36}, "X-Polyspec-Language"),
    ({}, {"X-Polyspec-Domain": "../../etc"}, "X-Polyspec-Domain"),
])
def test_malformed_or_unknown_pins_get_400(en_fr, registry_url, pins, header, param):
    en, fr = en_fr
    with serve_router(registry_url) as router:
        resp = httpx.post(f"{router.url}/v1/chat/completions", json={**HI, "polyspec": pins}, headers=header or {})
        error = openai_error(resp, 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert en.completion_requests == fr.completion_requests == 0


def test_a_domain_of_the_routing_table_may_be_pinned(registry, registry_url):
    with BrokenEngine("error500") as en, BrokenEngine("error500") as legal:
        registry.deploy(None, name="en-engine", url=en.url, languages=["en"], default=True)
        registry.deploy(None, name="legal-engine", url=legal.url, languages=["en"], domain="legal")
        with serve_router(registry_url, fail_threshold=100, max_attempts=1) as router:
            openai_error(chat(router.url, "Hello there", headers={"X-Polyspec-Domain": "Legal"}), 502)
    assert (legal.completion_requests, en.completion_requests) == (1, 0)


async def _flood(url: str, pins: list[tuple[str, str]]) -> dict[int, int]:
    statuses: dict[int, int] = {}
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        for pin in pins:
            queue.put_nowait(pin)

        async def worker() -> None:
            while not queue.empty():
                what, value = queue.get_nowait()
                resp = await client.post("/v1/chat/completions", json=HI, headers={f"X-Polyspec-{what}": value})
                statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1

        await asyncio.gather(*(worker() for _ in range(16)))
    return statuses


def test_ten_thousand_distinct_pins_keep_metrics_bounded(en_fr, registry_url):
    """The issue's flood: 10,000 distinct pins, valid ISO codes and garbage. /metrics stays small and its
    language and domain labels stay in the bounded set; garbage is refused before it reaches an engine."""
    codes = sorted({lang.alpha_3 for lang in pycountry.languages})[:6000]  # valid, almost none served
    garbage = [f"zz{i:05d}" for i in range(3000)]  # well-formed, not a language
    domains = [f"dom{i}" for i in range(1000)]
    pins = [("Language", c) for c in codes] + [("Language", g) for g in garbage] + [("Domain", d) for d in domains]
    assert len(set(pins)) == 10_000
    en, fr = en_fr
    # The engines fail fast and are marked down at once: the flood measures the router, not the fakes.
    with serve_router(registry_url, fail_threshold=1, health_interval_s=3600, max_attempts=1) as router:
        before = len(httpx.get(f"{router.url}/metrics").content)
        statuses = asyncio.run(_flood(router.url, pins))
        metrics = httpx.get(f"{router.url}/metrics").text
    assert statuses.get(400) == len(garbage) + len(domains), statuses
    assert sum(statuses.values()) == 10_000
    assert _label_values(metrics, "language") <= {"en", "fr", "und", "other"}
    assert _label_values(metrics, "domain") <= {"general", "code", "math"}
    assert len(metrics.encode()) - before < 20_000, f"/metrics grew from {before} to {len(metrics.encode())} bytes"
    # Only requests in flight before the first 500 marked the engines down reached them; the rest got 503.
    assert en.completion_requests + fr.completion_requests <= 2 * 16


@pytest.mark.integration
def test_live_stat_rows_stay_bounded_with_a_real_engine(registry, verifier, engines, registry_url):
    """Answered requests under 40 distinct pinned languages add live-stat rows only for the bounded labels."""
    url, _draft = engines["en"]
    registry.deploy(None, name="en-engine", url=url, languages=["en"], default=True)
    codes = sorted({lang.alpha_3 for lang in pycountry.languages})[:40]
    with serve_router(registry_url) as router:
        for code in codes:
            resp = chat(router.url, "Say hi.", model=SERVED, headers={"X-Polyspec-Language": code}, max_tokens=1)
            assert resp.status_code == 200, resp.text
    rows = registry.live_stats()
    assert rows and {r.language for r in rows} <= {"en", "und", "other"}
