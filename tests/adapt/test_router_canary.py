"""router.decision.canary: a canary deployment takes its share of its language and is only a fallback otherwise."""

from __future__ import annotations

import pytest

from polyspec.router.decision.canary import apply, canaries_of
from polyspec.router.table import build_table


def _deps(share: object = 0.25, language: object = "it") -> list[dict]:
    return [
        {"name": "en", "url": "http://e:1", "languages": ["en"], "draft": "en@1", "is_default": True},
        {"name": "plain", "url": "http://p:1", "languages": ["en"], "draft": None},
        {"name": "cand", "url": "http://c:1/", "languages": ["it"], "draft": "adapt-it@1",
         "launch": {"canary": {"language": language, "share": share, "attempt": "a"}}},
    ]


def test_marks_are_read_and_hostile_ones_ignored() -> None:
    assert canaries_of(_deps()) == {"http://c:1": ("it", 0.25)}
    for share in (1.5, -0.1, float("nan"), float("inf"), "0.5", True, None):
        assert canaries_of(_deps(share=share)) == {}
    assert canaries_of(_deps(language=7)) == {}
    assert canaries_of([{"url": None, "launch": {"canary": {"language": "it", "share": 1}}},
                        {"url": "http://x", "launch": "not a dict"}, {"url": "http://y", "launch": {"canary": []}}]) == {}


def test_the_canary_takes_its_share_of_its_language_and_is_last_otherwise() -> None:
    table = build_table(_deps(), "en", canaries_of(_deps()))
    by = {p.replicas[0].name: p for p in table.pools}
    ranked = [by["plain"], by["cand"], by["en"]]
    canaries = table.canaries
    assert [p.replicas[0].name for p in apply(ranked, "it", canaries, 0.10)] == ["cand", "plain", "en"]
    assert [p.replicas[0].name for p in apply(ranked, "it", canaries, 0.90)] == ["plain", "en", "cand"]
    assert [p.replicas[0].name for p in apply(ranked, "en", canaries, 0.0)] == ["plain", "en", "cand"]
    assert apply(ranked, "it", {}, 0.0) is ranked and apply(ranked, "it", None, 0.0) is ranked
    share = sum(apply(ranked, "it", canaries, i / 1000)[0] is by["cand"] for i in range(1000)) / 1000
    assert share == pytest.approx(0.25, abs=0.002)
