"""`polyspec deploy plan --engines N` (registry.fleet_search, registry.fleet_plan): the fleet that maximises
traffic-weighted predicted tokens/s, its plan file, and every hostile input refused before anything runs."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from polyspec.core.speed import PREFILL_STEPS_PER_TOKEN, draft_step, expected_tokens, request_tokens_per_second
from polyspec.registry.fleet_plan import PlanError, check_against, parse_traffic, read_plan
from polyspec.registry.fleet_search import PRIOR_DRAFT_STEP_S, PRIOR_PLAIN_STEP_S, Candidate, Inputs, prefill_cost

MIX = "en=0.4,fr=0.3,ja=0.3"


@pytest.fixture()
def drafts(reg, verifier_rec, base_draft_dir):
    """A base (English), a French specialist and a multilingual draft, with offline acceptance at k = 3."""
    figures = {
        "base": (["en"], {"en": [0.7, 0.5, 0.4], "fr": [0.3, 0.1, 0.05]}),
        "fr-spec": (["fr"], {"fr": [0.5, 0.3, 0.2], "en": [0.5, 0.3, 0.2]}),
        "multi": (["en", "fr", "ja"], {"en": [0.6, 0.4, 0.3], "fr": [0.6, 0.4, 0.3], "ja": [0.6, 0.4, 0.3]}),
    }
    refs = {}
    for name, (langs, acc) in figures.items():
        rec = reg.import_draft(base_draft_dir, verifier=verifier_rec.name, name=name, languages=langs, status="active")
        for lang, rates in acc.items():
            reg.add_evaluation(rec.ref, benchmark="mtbench", language=lang, k=3, acceptance=rates, method="offline",
                               num_prompts=160)
        refs[name] = rec.ref
    return refs


def _plan(registry_url, *args: str):
    out = CliRunner().invoke(_app(), ["deploy", "plan", "--registry", registry_url, "--memory-gib", "64", *args])
    return out


def _app():
    from polyspec.cli import app

    return app


def test_the_plan_takes_the_fastest_fleet_and_says_what_each_engine_adds(drafts, registry_url, tmp_path) -> None:
    """No calibration yet: the prior step times. Per cell the fastest deployment of the fleet; English goes to
    the base draft, French and Japanese to the multilingual one; the French specialist (below the multilingual
    draft on French) and a third engine add nothing, so two of three slots are used."""
    path = tmp_path / "plan.yaml"
    out = _plan(registry_url, "--engines", "3", "--traffic", MIX, "--write", str(path))
    assert out.exit_code == 0, out.output
    assert "What each engine adds" in out.stdout and "speed-up" in out.stdout
    plan = read_plan(path)
    assert {e.draft for e in plan.entries} == {drafts["base"], drafts["multi"]}
    assert plan.engines == 3 and plan.engines_used == 2
    by = {p.language: p for p in plan.predicted}
    assert by["en"].draft == drafts["base"] and by["fr"].draft == by["ja"].draft == drafts["multi"]
    # The formula, cell by cell: A / (P * prefill + A / E * step), prefill = 0.076 plain steps per prompt token.
    prefill = PREFILL_STEPS_PER_TOKEN * PRIOR_PLAIN_STEP_S
    en = by["en"]
    step = draft_step(PRIOR_PLAIN_STEP_S, PRIOR_DRAFT_STEP_S, k=en.k, ref_k=3, vocab=8192, ref_vocab=8192,
                      layer_vocab=8940.0)
    assert en.step_ms == pytest.approx(step * 1e3, abs=0.01)
    assert en.tps == pytest.approx(request_tokens_per_second(en.tokens_per_step, step, answer_tokens=96,
                                                             prompt_tokens=110, prefill_s_per_token=prefill), abs=1e-3)
    assert en.plain_tps == pytest.approx(96 / (110 * prefill + 96 * PRIOR_PLAIN_STEP_S), abs=1e-3)
    assert plan.weighted_tps == pytest.approx(sum(p.share * p.tps for p in plan.predicted), abs=1e-2)
    assert [m.engines for m in plan.marginal] == [1, 2, 3, 4]
    assert plan.marginal[1].added_tps > 0 and plan.marginal[2].added_tps == pytest.approx(0, abs=1e-3)
    assert plan.marginal[1].added in {e.name for e in plan.entries} and plan.marginal[2].added == "-"
    assert plan.assumptions["step_times"].startswith("prior")


def test_a_language_no_draft_knows_goes_to_no_speculation(drafts, registry_url) -> None:
    data = json.loads(_plan(registry_url, "--engines", "2", "--traffic", "pt=1", "--json").stdout)
    assert [(e["name"], e["k"]) for e in data["entries"]] == [("no-spec", 0)]
    assert data["speedup"] == pytest.approx(1.0)


def test_replicas_count_only_when_a_replica_runs_more_than_one_stream(reg, drafts, registry_url) -> None:
    """With a calibrated curve that slows with batch and 4 streams in flight, a second replica of the
    multilingual engine halves its batch; at concurrency 1 it would add nothing."""
    reg.deploy(drafts["multi"], name="m", url="http://127.0.0.1:9301", languages=["en"], default=True)
    reg.deploy(None, name="p", url="http://127.0.0.1:9302", languages=["en"])
    reg.record_calibration("m", [{"batch_size": 1, "step_s": 0.09, "tokens_per_s": 25, "requests": 3},
                                 {"batch_size": 4, "step_s": 0.27, "tokens_per_s": 9, "requests": 3}])
    reg.record_calibration("p", [{"batch_size": 1, "step_s": 0.06, "tokens_per_s": 16, "requests": 3},
                                 {"batch_size": 4, "step_s": 0.18, "tokens_per_s": 5, "requests": 3}])
    busy = json.loads(_plan(registry_url, "--engines", "2", "--traffic", "ja=1", "--concurrency", "4", "--json").stdout)
    assert [(e["draft"], e["replicas"]) for e in busy["entries"]] == [(drafts["multi"], 2)]
    assert busy["assumptions"]["step_times"] == "calibrated"
    alone = json.loads(_plan(registry_url, "--engines", "2", "--traffic", "ja=1", "--json").stdout)
    assert [(e["draft"], e["replicas"]) for e in alone["entries"]] == [(drafts["multi"], 1)]


def test_live_statistics_are_the_default_mix(reg, drafts, registry_url) -> None:
    none = _plan(registry_url, "--engines", "1")
    assert none.exit_code == 2 and "--traffic" in none.output
    reg.record_live_stats("r1", [{"language": "fr", "domain": "general", "draft_name": "none", "requests": 30},
                                 {"language": "und", "domain": "general", "draft_name": "none", "requests": 50}])
    data = json.loads(_plan(registry_url, "--engines", "1", "--json").stdout)
    assert [(c["language"], c["share"]) for c in data["traffic"]] == [("fr", 1.0)]


def test_the_plan_reads_the_non_degenerate_acceptance(reg, drafts, registry_url) -> None:
    """Offline answers loop far more than served ones: where a draft has a non-degenerate figure for the
    language, the plan's tokens per step come from it, not from the (higher) figure over all answers."""
    rates = [0.5, 0.3, 0.2]
    reg.add_evaluation(drafts["multi"], benchmark="mtbench", language="ja", k=3, acceptance=rates, method="offline",
                       num_prompts=30, subset="non_degenerate")
    [cell] = json.loads(_plan(registry_url, "--engines", "1", "--traffic", "ja=1", "--json").stdout)["predicted"]
    assert cell["draft"] == drafts["multi"]
    assert cell["tokens_per_step"] == pytest.approx(expected_tokens(rates, cell["k"]), abs=1e-4)


def test_each_engine_s_measured_prefill_enters_its_prediction(reg, drafts, registry_url) -> None:
    """Calibration measures prefill per engine (router.calibrate): the plan counts prompt tokens at the
    multilingual engine's own figure and no speculation's at its own, not at 0.076 verifier-alone steps."""
    reg.deploy(drafts["multi"], name="m", url="http://127.0.0.1:9301", languages=["ja"], default=True)
    reg.deploy(None, name="p", url="http://127.0.0.1:9302", languages=["en"])
    reg.record_calibration("m", [{"batch_size": 1, "step_s": 0.09, "tokens_per_s": 25, "requests": 6,
                                  "details": {"prefill_s_per_token": 0.006}}])
    reg.record_calibration("p", [{"batch_size": 1, "step_s": 0.06, "tokens_per_s": 16, "requests": 6,
                                  "details": {"prefill_s_per_token": 0.003}}])
    data = json.loads(_plan(registry_url, "--engines", "1", "--traffic", "ja=1", "--json").stdout)
    [cell] = data["predicted"]
    assert data["assumptions"]["prefill"] == "calibrated" and data["assumptions"]["prefill_ms_per_token"] == 3.0
    assert cell["tps"] == pytest.approx(request_tokens_per_second(
        cell["tokens_per_step"], cell["step_ms"] / 1e3, answer_tokens=96, prompt_tokens=110,
        prefill_s_per_token=0.006), abs=1e-2)
    assert cell["plain_tps"] == pytest.approx(96 / (110 * 0.003 + 96 * 0.06), abs=1e-3)


def test_prefill_falls_back_from_the_engine_to_its_vocabulary_to_any_draft_engine_to_the_prior() -> None:
    def inputs(prefill: dict) -> Inputs:
        return Inputs(offline={}, offline_samples={}, live={}, curves={}, prefill=prefill)

    k5 = Candidate("multi-k5", "multi@1", 5, 12288)
    plain = Candidate("no-spec", None, 0, None)
    assert prefill_cost(inputs({(12288, 5): 0.007, (12288, 3): 0.005}), k5, 0.06) == 0.007
    assert prefill_cost(inputs({(12288, 3): 0.005, (12288, 1): 0.003, (8192, 3): 0.009}), k5, 0.06) == 0.004
    assert prefill_cost(inputs({(8192, 3): 0.009, (None, 0): 0.002}), k5, 0.06) == 0.009
    assert prefill_cost(inputs({(None, 0): 0.002}), k5, 0.06) == pytest.approx(PREFILL_STEPS_PER_TOKEN * 0.06)
    assert prefill_cost(inputs({(None, 0): 0.002, (8192, 3): 0.009}), plain, 0.06) == 0.002
    assert prefill_cost(inputs({(8192, 3): 0.009}), plain, 0.06) == pytest.approx(PREFILL_STEPS_PER_TOKEN * 0.06)


def test_a_larger_draft_head_costs_more_per_step() -> None:
    """core.speed.draft_step: the draft's share of a step scales with k and with its weights (layer + head rows)."""
    assert draft_step(0.06, 0.09, k=3, ref_k=3, vocab=8192, ref_vocab=8192, layer_vocab=8940) == pytest.approx(0.09)
    assert draft_step(0.06, 0.09, k=6, ref_k=3, vocab=8192, ref_vocab=8192, layer_vocab=8940) == pytest.approx(0.12)
    assert draft_step(0.06, 0.09, k=3, ref_k=3, vocab=12288, ref_vocab=8192, layer_vocab=8940) == pytest.approx(
        0.06 + 0.03 * (8940 + 12288) / (8940 + 8192))


@pytest.mark.parametrize(("args", "message"), [
    (["--engines", "0"], "at least 1"),
    (["--engines", "-2"], "at least 1"),
    (["--engines", "2", "--traffic", "en=0.5,xx=0.5"], "unknown language code 'xx'"),
    (["--engines", "2", "--traffic", "en=0.5,frnch=0.5"], "unknown language"),
    (["--engines", "2", "--traffic", "en=0.5,fr=0.4"], "must sum to 1"),
    (["--engines", "2", "--traffic", "en=1.5,fr=-0.5"], "from 0 to 1"),
    (["--engines", "2", "--traffic", "en=0.5,fr=-0.1,de=0.6"], "from 0 to 1"),
    (["--engines", "2", "--traffic", "en=0.5,en=0.5"], "twice"),
    (["--engines", "2", "--traffic", "en=half"], "must be a number"),
    (["--engines", "2", "--traffic", "en:poetry=1"], "unknown domain"),
    (["--engines", "2", "--traffic", "und=1"], "real languages"),
    (["--engines", "2", "--traffic", "en=nan"], "from 0 to 1"),
    (["--traffic", "en=1"], "give --engines"),
    (["--engines", "9", "--memory-gib", "8"], "do not fit in memory"),
])
def test_hostile_input_is_refused_before_anything_is_written(drafts, registry_url, tmp_path, args, message) -> None:
    path = tmp_path / "plan.yaml"
    out = CliRunner().invoke(_app(), ["deploy", "plan", "--registry", registry_url, *(
        [] if "--memory-gib" in args else ["--memory-gib", "64"]), *args, "--write", str(path)])
    assert out.exit_code == 2, out.output
    assert message in (out.stderr or out.output)
    assert not path.exists()


def test_a_plan_file_is_checked_against_the_registry(reg, drafts, registry_url, tmp_path) -> None:
    path = tmp_path / "plan.yaml"
    assert _plan(registry_url, "--engines", "2", "--traffic", MIX, "--write", str(path)).exit_code == 0
    plan = read_plan(path)
    known = {d.ref: d for d in reg.drafts()}
    check_against(plan, plan.verifier, known)  # as written: fine
    with pytest.raises(PlanError, match="plan for verifier"):
        check_against(plan, "another-verifier", known)
    with pytest.raises(LookupError, match="does not have"):
        check_against(plan, plan.verifier, {k: v for k, v in known.items() if k != drafts["multi"]})
    raw = yaml.safe_load(path.read_text())
    for change, message in [({"schema_version": 2}, "schema_version 2"), ({"engines": 0}, "engines"),
                            ({"traffic": [{"language": "en", "share": 0.5}]}, "sum to 1"),
                            ({"entries": []}, "entries")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({**raw, **change}))
        with pytest.raises(PlanError, match=message):
            read_plan(bad)
    (tmp_path / "broken.yaml").write_text("entries: [unclosed\n")
    with pytest.raises(PlanError, match="cannot read plan file"):
        read_plan(tmp_path / "broken.yaml")
    with pytest.raises(PlanError, match="not found"):
        read_plan(tmp_path / "missing.yaml")


def test_a_plan_that_cannot_be_written_says_so(drafts, registry_url, tmp_path) -> None:
    (tmp_path / "file").write_text("")
    out = _plan(registry_url, "--engines", "1", "--traffic", "en=1", "--write", str(tmp_path / "file" / "plan.yaml"))
    assert out.exit_code == 2 and "cannot write the plan" in (out.stderr or out.output)


def test_traffic_parsing_normalises_codes() -> None:
    cells = parse_traffic("FRA=0.25, en:code=0.25,ja=0.5")
    assert [(c.language, c.domain, c.share) for c in cells] == [("fr", "general", 0.25), ("en", "code", 0.25),
                                                                 ("ja", "general", 0.5)]
