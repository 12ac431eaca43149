"""The speed policy (router.decision.speed): the fastest predicted pool wins, speculation-free pools included;
uncertainty, load, exploration and the lack of any calibration each change the choice as documented."""

from __future__ import annotations

from typing import Any

import pytest

from polyspec.core.counters import SpecCounts
from polyspec.router.decision.policy import candidate_pools
from polyspec.router.decision.speed import Explorer, LiveSteps, SpeedInputs, batch_bucket, extra_pools, rank
from polyspec.router.table import build_table

SPEC_STEP = {1: 0.080, 4: 0.120}  # a draft engine: a verify step of 4 tokens plus 3 draft steps
PLAIN_STEP = {1: 0.055, 4: 0.070}  # the verifier alone: one token per step


def deployments(calibrated: bool = True) -> list[dict[str, Any]]:
    def dep(name: str, draft: str | None, languages: list[str], acceptance: dict[str, list[float]],
            default: bool = False) -> dict[str, Any]:
        return {"name": name, "url": f"http://{name}:8000", "draft": draft, "languages": languages,
                "is_default": default, "k": 3 if draft else None, "offline_acceptance": acceptance,
                "offline_samples": {lang: 80 for lang in acceptance},
                "offline_mal": {lang: 1 + sum(a) for lang, a in acceptance.items()},
                "step_s": (SPEC_STEP if draft else PLAIN_STEP) if calibrated else {}}

    return [
        dep("en-engine", "en-base@1", ["en"], {"en": [0.55, 0.30, 0.15], "fr": [0.12, 0.03, 0.0]}, default=True),
        dep("fr-engine", "fr@1", ["fr"], {"fr": [0.60, 0.40, 0.25]}),
        dep("plain", None, ["en"], {}),
    ]


def inputs(live: dict | None = None, in_flight: dict[str, int] | None = None, explore: float = 0.0,
           steps: LiveSteps | None = None) -> SpeedInputs:
    flights = in_flight or {}
    return SpeedInputs(live or {}, steps or LiveSteps(), Explorer(explore), lambda url: flights.get(url, 0),
                       lambda url: True, prior_spec_steps=2000, prior_step_requests=20, z=1.64)


def ranked(language: str, table=None, **kw: Any):
    table = table or build_table(deployments(), "en")
    pools = candidate_pools(table, language, "general", {}, 2000)
    return rank(pools, extra_pools(table, language, "general", {}, None), language, "general", inputs(**kw))


def test_a_language_with_its_own_draft_goes_to_it_when_it_is_faster_than_plain_decoding() -> None:
    r = ranked("fr")
    assert r.reason == "fastest" and r.chosen is not None
    assert r.chosen.pool.draft == "fr@1"
    assert r.chosen.tps == pytest.approx((1 + 0.60 + 0.40 + 0.25) / 0.080)
    assert [c.pool.draft for c in r.candidates] == ["fr@1", "none", "en-base@1"]


def test_a_language_without_a_draft_goes_to_plain_decoding_not_to_the_default_draft() -> None:
    """Italian: the MAL policy sends it to the English default draft, which nothing shows accepts Italian;
    as E = 1 there, that engine is slower than the verifier alone, which the speed policy picks."""
    table = build_table(deployments(), "en")
    assert candidate_pools(table, "it", "general", {}, 2000)[0].draft == "en-base@1"  # MAL policy
    r = ranked("it", table)
    assert r.chosen is not None and r.chosen.pool.draft == "none"
    assert r.chosen.tps == pytest.approx(1 / 0.055)
    en = next(c for c in r.candidates if c.pool.draft == "en-base@1")
    assert en.expected == 1.0 and en.tps == pytest.approx(1 / 0.080)


def test_a_poor_draft_loses_to_plain_decoding_even_with_offline_evidence() -> None:
    """French through the English draft accepts so little (E = 1.15) that the verifier alone is faster."""
    deps = [d for d in deployments() if d["name"] != "fr-engine"]
    r = ranked("fr", build_table(deps, "en"))
    assert r.chosen is not None and r.chosen.pool.draft == "none"
    en = r.candidates[1]
    assert en.pool.draft == "en-base@1" and en.expected == pytest.approx(1.15)


def test_load_changes_the_choice_through_the_step_time_curve() -> None:
    """With six requests in flight on the French engine its step slows (interpolated, then extended) below
    the idle verifier's pace."""
    assert ranked("fr").chosen.pool.draft == "fr@1"  # type: ignore[union-attr]
    busy = ranked("fr", in_flight={"http://fr-engine:8000": 6})
    assert busy.chosen is not None and busy.chosen.pool.draft == "none"
    fr = next(c for c in busy.candidates if c.pool.draft == "fr@1")
    assert fr.batch == 7 and fr.step_s == pytest.approx(0.120 + (0.120 - 0.080) / 3 * 3)


def test_few_live_samples_rank_by_a_lower_bound_not_by_luck() -> None:
    """Two French drafts with the same mean: the one with 3 requests behind it ranks after the one with
    80 offline prompts, because its lower confidence bound is lower."""
    deps = deployments()
    deps.append({**deps[1], "name": "fr-new", "url": "http://fr-new:8000", "draft": "fr@2",
                 "offline_acceptance": {}, "offline_samples": {}})
    table = build_table(deps, "en")
    per_pos = (600, 400, 250)
    live = {("fr", "general", "fr@2"): SpecCounts(requests=3, num_spec_steps=1000, num_accepted_tokens=1250,
                                                   accepted_per_pos=per_pos)}
    r = rank(candidate_pools(table, "fr", "general", live, 2000), extra_pools(table, "fr", "general", live, None),
             "fr", "general", inputs(live=live))
    old, new = (next(c for c in r.candidates if c.pool.draft == d) for d in ("fr@1", "fr@2"))
    assert new.expected == pytest.approx(old.expected)
    assert new.lower < old.lower and r.chosen is old


def test_a_new_draft_of_the_language_keeps_its_traffic_until_another_pool_is_surely_faster() -> None:
    """Italian after `polyspec adapt` swapped in an Italian draft: the new draft (4 live requests, the
    language's own pool, so the incumbent) is judged by its point estimate; the English draft, measured on
    thousands of Italian steps, by its lower bound. The new draft keeps Italian while its estimate is higher,
    and loses it once the English draft's lower bound passes that estimate."""
    deps = deployments() + [{"name": "it-new", "url": "http://it-new:8000", "draft": "it@1", "languages": ["it"],
                             "is_default": False, "k": 3, "offline_acceptance": {}, "offline_samples": {},
                             "offline_mal": {}, "step_s": SPEC_STEP}]
    deps = [d for d in deps if d["name"] != "plain"]
    table = build_table(deps, "en")

    def rank_it(new_per_pos: tuple[int, ...], en_per_pos: tuple[int, ...]):
        live = {("it", "general", "it@1"): SpecCounts(requests=4, num_spec_steps=100, accepted_per_pos=new_per_pos),
                ("it", "general", "en-base@1"): SpecCounts(requests=2000, num_spec_steps=20000,
                                                           accepted_per_pos=en_per_pos)}
        return rank(candidate_pools(table, "it", "general", live, 2000), extra_pools(table, "it", "general", live, None),
                    "it", "general", inputs(live=live))

    r = rank_it((45, 20, 8), (8000, 3000, 1000))  # E: new 1.73 (lower about 1.3), English 1.60
    new = next(c for c in r.candidates if c.pool.draft == "it@1")
    assert new.lower < 1.6 < new.expected and r.chosen is new
    r = rank_it((45, 20, 8), (9000, 5000, 3000))  # English surely at 1.85 > 1.73
    assert r.chosen is not None and r.chosen.pool.draft == "en-base@1"


def test_exploration_sends_a_bounded_share_to_the_least_known_candidate() -> None:
    table = build_table(deployments(), "en")
    pools = candidate_pools(table, "fr", "general", {}, 2000)
    shared = inputs(explore=0.25)
    extra = extra_pools(table, "fr", "general", {}, None)
    reasons = [rank(pools, extra, "fr", "general", shared) for _ in range(40)]
    explored = [r for r in reasons if r.reason == "explore"]
    assert len(explored) == 10  # one in four
    # The least evidence: the English draft on French (80 offline prompts) before the verifier (certain).
    assert {r.chosen.pool.draft for r in explored} == {"en-base@1"}  # type: ignore[union-attr]
    assert all(r.chosen.pool.draft == "fr@1" for r in reasons if r.reason == "fastest")  # type: ignore[union-attr]
    off = inputs(explore=0.0)
    assert all(rank(pools, extra, "fr", "general", off).reason == "fastest" for _ in range(40))


def test_without_any_step_time_the_mal_order_stands_unchanged() -> None:
    table = build_table(deployments(calibrated=False), "en")
    for language in ("fr", "it", "en"):
        pools = candidate_pools(table, language, "general", {}, 2000)
        r = rank(pools, extra_pools(table, language, "general", {}, None), language, "general", inputs())
        assert r.reason == "no_speed_model"
        assert [c.pool.key for c in r.candidates] == [p.key for p in pools]


def test_live_step_times_make_an_uncalibrated_pool_predictable() -> None:
    deps = deployments()
    deps[1]["step_s"] = {}  # the French engine was never calibrated
    table = build_table(deps, "en")
    r = ranked("fr", table)
    # One candidate cannot be compared: the MAL order stands (the French pool first, plain decoding left out).
    assert r.reason == "no_speed_model" and [c.pool.draft for c in r.candidates] == ["fr@1", "en-base@1"]
    assert r.candidates[0].step_source == "none"
    steps = LiveSteps()
    for _ in range(5):
        steps.observe("http://fr-engine:8000", 1, seconds=0.9, steps=10, tokens=22)  # 90 ms per step, measured
    steps.observe("http://fr-engine:8000", 1, seconds=0.01, steps=2, tokens=4)  # mostly prefill: ignored
    steps.observe("http://fr-engine:8000", 1, seconds=0.01, steps=10**6, tokens=30)  # impossible report: ignored
    r = ranked("fr", table, steps=steps)
    fr = next(c for c in r.candidates if c.pool.draft == "fr@1")
    assert fr.step_s == pytest.approx(0.09) and fr.step_source == "live"
    assert r.chosen is fr  # 2.25 tokens / 90 ms beats 1 token / 55 ms


def test_live_steps_are_bucketed_by_batch_and_bounded() -> None:
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]
    steps = LiveSteps()
    steps.observe("u", 3, 1.0, 10, 20)
    assert steps.get(["u"], 4) == (pytest.approx(0.1), 1) and steps.get(["u"], 1) == (None, 0)
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        steps.observe("u", 1, bad, 10, 20)
    assert steps.get(["u"], 1) == (None, 0)
    for i in range(5000):
        steps.observe(f"u{i}", 1, 1.0, 10, 20)
    assert len(steps.describe()) <= 4096


IT_TEXT = "Potresti spiegarmi in due frasi perché il cielo è blu durante il giorno e rosso al tramonto?"


def test_route_explain_sends_an_unserved_language_to_plain_decoding(registry, registry_url, fake_draft_dir, fake_verifier):
    """Through `polyspec route explain` on a real registry: Italian, which no draft serves but the English draft
    has an offline figure for, is identified as Italian and goes to the engine without speculation, the
    faster one at that acceptance; under the MAL policy it goes to the English default draft."""
    import json

    from typer.testing import CliRunner

    from polyspec.cli import app
    from tests.router.conftest import add_draft

    ref = add_draft(registry, fake_draft_dir, fake_verifier.name, "en-draft", ["en"], {"en": 2.2})
    registry.add_evaluation(ref, benchmark="mtbench", language="it", k=3, acceptance=[0.15, 0.05, 0.01],
                            method="offline", num_prompts=80)
    registry.deploy(ref, name="en-engine", url="http://127.0.0.1:9101", languages=["en"], default=True)
    registry.deploy(None, name="plain", url="http://127.0.0.1:9102", languages=["en"], verifier=fake_verifier.name)
    registry.record_calibration("en-engine", [{"batch_size": 1, "step_s": 0.080, "tokens_per_s": 25, "requests": 2}])
    registry.record_calibration("plain", [{"batch_size": 1, "step_s": 0.055, "tokens_per_s": 18, "requests": 2}])
    body = json.dumps({"model": "polyspec", "messages": [{"role": "user", "content": IT_TEXT}]})

    def explain(*env: str) -> dict:
        result = CliRunner(env=dict(e.split("=") for e in env)).invoke(
            app, ["route", "explain", "--registry", registry_url, "--json"], input=body)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    speed = explain("POLYSPEC_ROUTER_POLICY=speed")
    assert speed["decision"]["language"] == "it" and speed["decision"]["stats_language"] == "it"
    assert speed["chosen"]["replica"] == "plain" and speed["policy"]["reason"] == "fastest"
    by_draft = {p["draft"]: p for p in speed["pools"]}
    assert by_draft["none"]["tier"] == "no-speculation"
    assert by_draft["none"]["speed"]["predicted_tps"] == pytest.approx(1 / 0.055, abs=0.01)
    assert by_draft[ref]["speed"]["expected_tokens_per_step"] == pytest.approx(1.21)
    mal = explain("POLYSPEC_ROUTER_POLICY=mal")
    assert mal["chosen"]["replica"] == "en-engine" and mal["policy"] == {"policy": "mal", "reason": None}


def test_a_draft_with_evidence_on_another_language_is_a_candidate_for_it() -> None:
    """No pool serves Italian; the French draft accepts it well offline, so Italian goes there. Without
    that figure the French pool is no candidate at all (nothing predicts it), and plain decoding wins."""
    deps = deployments()
    assert "fr@1" not in [c.pool.draft for c in ranked("it", build_table(deps, "en")).candidates]
    deps[1]["offline_acceptance"]["it"] = [0.45, 0.20, 0.10]
    deps[1]["offline_samples"]["it"] = 160
    r = ranked("it", build_table(deps, "en"))
    assert r.chosen is not None and r.chosen.pool.draft == "fr@1"
    assert r.chosen.expected == pytest.approx(1.75)
    live = {("it", "general", "de@1"): SpecCounts(requests=1, num_spec_steps=10)}  # no such pool: ignored
    # Pools without speculation first, then drafts with evidence on Italian (the English one has none).
    assert [p.draft for p in extra_pools(build_table(deps, "en"), "it", "general", live, None)] == ["none", "fr@1"]


def test_docs_settings_table_shows_the_router_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/speed.md's table of POLYSPEC_ROUTER_… settings says what RouterConfig actually defaults to (the
    speed policy among them), so the page cannot drift from the code."""
    import re
    from pathlib import Path

    from polyspec.router.config import RouterConfig

    text = (Path(__file__).resolve().parents[2] / "docs" / "speed.md").read_text()
    rows = re.findall(r"^\| `([A-Z_]+)` \| `?([^`|]+?)`? \|", text, flags=re.M)
    assert {name for name, _ in rows} >= {"POLICY", "EXPLORE_SHARE", "SPEED_CONFIDENCE_Z", "PRIOR_SPEC_STEPS"}
    fields = RouterConfig.model_fields
    for name, shown in rows:
        default = fields[name.lower()].default
        assert shown == str(default), (name, shown, default)
    monkeypatch.delenv("POLYSPEC_ROUTER_POLICY", raising=False)
    assert RouterConfig().policy == "speed"


def test_predictions_kept_for_the_dashboard_stay_bounded_and_latest_wins() -> None:
    """Telemetry.observe_prediction: one figure per (language, draft), the latest, and never more than the cap
    however many distinct pairs a hostile or broken table produces (the dashboard reads this dict)."""
    from polyspec.router import telemetry
    from polyspec.router.telemetry import Telemetry

    t = Telemetry("r")
    t.observe_prediction("fr", "fr@1", 20.0)
    t.observe_prediction("fr", "fr@1", 18.5)
    assert t.predicted == {("fr", "fr@1"): 18.5}
    for i in range(telemetry._MAX_PREDICTED + 10):
        t.observe_prediction(f"l{i}", "d@1", float(i))
    assert 0 < len(t.predicted) <= telemetry._MAX_PREDICTED
    assert t.predicted[(f"l{telemetry._MAX_PREDICTED + 9}", "d@1")] == telemetry._MAX_PREDICTED + 9


def test_engines_of_one_shape_share_one_step_time_calibrated_and_live() -> None:
    """Two draft engines of one shape calibrated 75 and 104 ms/step at batch 1 (the spread five such engines
    showed on one host, docs/speed.md): by its own figure the English engine would take French, whose draft
    accepts it better. Pooled, both read 89.5 ms and French stays on its draft; live step times are read over
    both engines too. Without a shape (a fleet YAML without one) each engine keeps its own figure."""
    def two(shaped: bool) -> list[dict[str, Any]]:
        deps = deployments()[:2]
        deps[1]["offline_acceptance"]["fr"] = [0.55, 0.30, 0.15]
        deps[0]["offline_acceptance"]["fr"] = [0.45, 0.20, 0.10]
        deps[0]["step_s"], deps[1]["step_s"] = {1: 0.075}, {1: 0.104}
        for d in deps:
            d["step_shape"] = "one-host-k3" if shaped else None
        return deps

    alone = ranked("fr", build_table(two(False), "en"))
    assert alone.chosen.pool.draft == "en-base@1"  # type: ignore[union-attr]  # the noise decides
    table = build_table(two(True), "en")
    assert {p.key: p.step_urls for p in table.pools} == {
        p.key: ("http://en-engine:8000", "http://fr-engine:8000") for p in table.pools}
    pooled = ranked("fr", table)
    assert pooled.chosen.pool.draft == "fr@1"  # type: ignore[union-attr]
    assert {c.pool.draft: c.step_s for c in pooled.candidates} == {"fr@1": pytest.approx(0.0895),
                                                                  "en-base@1": pytest.approx(0.0895)}
    assert pooled.chosen.to_json()["step_engines"] == 2  # type: ignore[union-attr]
    steps = LiveSteps()
    for _ in range(20):
        steps.observe("http://en-engine:8000", 1, seconds=1.2, steps=10, tokens=20)  # measured on one engine
    live = ranked("fr", table, steps=steps)
    assert [c.step_s for c in live.candidates] == [pytest.approx((20 * 0.0895 + 20 * 0.12) / 40)] * 2
    assert live.chosen.step_source == "calibrated+live"  # type: ignore[union-attr]


def _two_sorts(table: Any, language: str, domain: str, live: dict, extra: list, speed: SpeedInputs) -> list[str]:
    """The ranking as it was computed before `rank_places`: each tier sorted by blended MAL, duplicates
    dropped, then the speed order sorted (stably) from that order, the first pool judged by its point estimate."""
    from polyspec.router.decision.policy import GENERAL, blended_mal
    from polyspec.router.decision.speed import candidate

    tiers = [table.pools_for(language, domain)] + ([table.pools_for(language, GENERAL)] if domain != GENERAL else [])
    ordered: list = []
    for tier in [*tiers, table.default_pools]:
        ordered += sorted(tier, key=lambda p: ((s := blended_mal(p, language, domain, live, 50)) is None,
                                               -(s or 0.0), p.key))
    mal = list({p.key: p for p in ordered}.values())  # each pool at its first occurrence
    seen = {p.key for p in mal}
    scored = [candidate(p, language, domain, speed) for p in mal + [p for p in extra if p.key not in seen]]
    if any(c.lower_tps is None for c in scored):
        return [c.pool.key for c in scored if c.pool.key in seen]
    first = scored[0].pool.key if mal else None
    order = sorted(scored, key=lambda c: -((c.tps if c.pool.key == first else c.lower_tps) or 0.0))
    if len(order) > 1 and speed.explorer.tick(language, domain):
        others = order[1:]
        pick = min(others, key=lambda c: (c.samples if c.step_s is not None else -1.0, others.index(c)))
        order.remove(pick)
        order.insert(0, pick)
    return [c.pool.key for c in order]


def test_one_sort_ranks_as_the_mal_order_then_the_speed_order_did() -> None:
    """Random fleets with ties (equal step times and figures), several tiers, live counts and load: sorting
    once by speed with ties in the MAL order gives the order the two sorts gave, exploration included."""
    import random

    from polyspec.router.decision.policy import mal_places
    from polyspec.router.decision.speed import rank_places

    rng = random.Random(7)
    for _ in range(300):
        deps = []
        for i in range(rng.randint(1, 7)):
            draft = rng.choice([None, "a@1", "b@1", "c@1"])
            langs = sorted(rng.sample(["en", "fr", "de"], rng.randint(1, 2)))
            rates = {lang: [rng.choice([0.5, 0.3])] * 3 for lang in rng.sample(["en", "fr", "de", "it"], 2)}
            deps.append({"name": f"e{i}", "url": f"http://e{i}:8000", "draft": draft, "languages": langs,
                         "domain": rng.choice(["general", "code"]), "is_default": rng.random() < 0.3,
                         "k": 3 if draft else None, "offline_acceptance": rates if draft else {},
                         "offline_mal": {k: 1 + sum(v) for k, v in rates.items()} if draft else {},
                         "step_s": rng.choice([{1: 0.08}, {1: 0.08}, {1: 0.05}, {}])})
        table = build_table(deps, "en")
        language, domain = rng.choice(["en", "fr", "de", "it"]), rng.choice(["general", "code"])
        live = {(language, domain, p.draft): SpecCounts(requests=5, num_spec_steps=rng.choice([0, 40]),
                                                         num_accepted_tokens=rng.choice([0, 30]))
                for p in table.pools if rng.random() < 0.5}
        flights = {d["url"]: rng.choice([0, 0, 2]) for d in deps}
        extra = extra_pools(table, language, domain, live, None)
        share = rng.choice([0.0, 0.5])

        def speed(share: float = share) -> SpeedInputs:
            return SpeedInputs(live, LiveSteps(), Explorer(share), lambda u: flights[u], lambda u: True, 50, 20, 1.64)

        old_inputs, new_inputs = speed(), speed()
        for _ in range(2):  # twice: the second call of an explorer at share 0.5 explores
            expected = _two_sorts(table, language, domain, live, extra, old_inputs)
            got = rank_places(mal_places(table, language, domain, live, 50), extra, language, domain, new_inputs)
            assert [c.pool.key for c in got.candidates] == expected
