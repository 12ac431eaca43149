"""The planner's step at the traffic's context (core.speed.ContextCost, registry.fleet_search.context_cost): a
decode step grows with the context it attends over, calibration measures how much (router.calibrate), and the
plan reads the step at the request's mean context, not at calibration's short prompts."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from polyspec.core.speed import ContextCost, request_seconds
from polyspec.registry.fleet_search import Candidate, Inputs, context_cost


def _plan(registry_url: str, *args: str):
    from polyspec.cli import app

    return CliRunner().invoke(app, ["deploy", "plan", "--registry", registry_url, "--memory-gib", "64", *args])


@pytest.fixture()
def multi(reg, verifier_rec, base_draft_dir) -> str:
    rec = reg.import_draft(base_draft_dir, verifier=verifier_rec.name, name="multi", languages=["en", "ja"],
                           status="active")
    reg.add_evaluation(rec.ref, benchmark="mtbench", language="ja", k=3, acceptance=[0.6, 0.4, 0.3], method="offline",
                       num_prompts=40)
    reg.deploy(rec.ref, name="m", url="http://127.0.0.1:9301", languages=["ja"], default=True, launch={"k": 3})
    reg.deploy(None, name="p", url="http://127.0.0.1:9302", languages=["en"])
    return rec.ref


def _calibrate(reg, name: str, step_s: float, **details: object) -> None:
    reg.record_calibration(name, [{"batch_size": 1, "step_s": step_s, "tokens_per_s": 20, "requests": 6,
                                   "details": {"prefill_s_per_token": 0.003, **details}}])


def test_the_step_grows_with_the_request_s_mean_context_and_never_falls_below_half() -> None:
    cost = ContextCost(s_per_token=0.0001, measured_at=50)
    assert cost.step(0.08, 50) == pytest.approx(0.08)
    assert cost.step(0.08, 250) == pytest.approx(0.10)
    assert cost.step(0.08, 0) == pytest.approx(0.075)  # a shorter context than calibration's: a little faster
    assert ContextCost(0.01, 1000).step(0.08, 0) == pytest.approx(0.04)
    # the request's mean context is its prompt and half its answer: 110 + 48 tokens at 0.1 ms more a token
    plain = request_seconds(2.0, 0.08, answer_tokens=96, prompt_tokens=110, prefill_s_per_token=0.003)
    longer = request_seconds(2.0, 0.08, answer_tokens=96, prompt_tokens=110, prefill_s_per_token=0.003,
                             context=cost)
    assert longer - plain == pytest.approx(48 * 0.0001 * (110 + 48 - 50))
    # a prompt far shorter than the calibrated one's saves at most half the steps' time
    held = ContextCost(prompt_at=140)
    assert request_seconds(2.0, 0.08, answer_tokens=2, prompt_tokens=1, prefill_s_per_token=0.003,
                           context=held) == pytest.approx(0.04)


def test_the_plan_reads_each_engine_s_step_at_the_traffic_s_context(reg, multi, registry_url) -> None:
    _calibrate(reg, "m", 0.09, step_s_per_context_token=0.0001, context_tokens=48)
    _calibrate(reg, "p", 0.06, step_s_per_context_token=0.00005, context_tokens=48)
    data = json.loads(_plan(registry_url, "--engines", "1", "--traffic", "ja=1", "--prompt-tokens", "150",
                            "--json").stdout)
    [cell] = data["predicted"]
    context = 150 + 96 / 2
    step = cell["step_ms"] / 1e3 + 0.0001 * (context - 48)  # its k's step (k = 3 calibrated), at the context
    assert cell["tps"] == pytest.approx(96 / (150 * 0.003 + 96 / cell["tokens_per_step"] * step), rel=1e-3)
    assert cell["plain_tps"] == pytest.approx(96 / (150 * 0.003 + 96 * (0.06 + 0.00005 * (context - 48))), rel=1e-3)
    assert data["assumptions"]["context_ms_per_token"] == pytest.approx(0.05)  # the verifier alone's


def test_the_plan_adds_prefill_only_for_prompt_tokens_beyond_the_calibrated_chat_turns(reg, multi, registry_url) -> None:
    """A step calibrated on chat turns of 140 prompt tokens already holds their prefill: a 150-token prompt adds
    10 tokens' prefill, a 100-token one takes 40 away. A calibration without the figure (short raw prompts), or with
    one that is no measurement, adds the whole prompt's."""
    _calibrate(reg, "m", 0.09, step_s_per_context_token=0.0, context_tokens=188, prompt_tokens=140)
    _calibrate(reg, "p", 0.06, step_s_per_context_token=0.0, context_tokens=188, prompt_tokens="140")
    for prompt in (150, 100):
        data = json.loads(_plan(registry_url, "--engines", "1", "--traffic", "ja=1", "--prompt-tokens", str(prompt),
                                "--json").stdout)
        [cell] = data["predicted"]
        decode = 96 / cell["tokens_per_step"] * 0.09
        assert cell["tps"] == pytest.approx(96 / (decode + (prompt - 140) * 0.003), rel=1e-3)
        assert cell["plain_tps"] == pytest.approx(96 / (96 * 0.06 + prompt * 0.003), rel=1e-3)


def test_the_plan_spreads_calibration_s_per_request_costs_over_the_request_s_own_steps(reg, multi, registry_url) -> None:
    """A step calibrated on 96-token answers at 2 tokens a step (48 steps) holds 1/48 of its chat turn's prefill
    and of the per-request overhead in each step: a request of other steps pays those costs whole, once."""
    details = dict(step_s_per_context_token=0.0, context_tokens=188, prompt_tokens=140, overhead_s=0.5, max_tokens=96,
                   tokens_per_step=2.0)
    _calibrate(reg, "m", 0.09, **details)
    _calibrate(reg, "p", 0.06, **details)
    data = json.loads(_plan(registry_url, "--engines", "1", "--traffic", "ja=1", "--prompt-tokens", "150", "--json",
                            "--answer-tokens", "40").stdout)
    [cell] = data["predicted"]
    steps = 40 / cell["tokens_per_step"]
    held = (140 * 0.003 + 0.5) * steps / 48
    step = cell["step_ms"] / 1e3  # the planner's k may be another than the calibrated one's
    assert cell["tps"] == pytest.approx(40 / (steps * step + 150 * 0.003 + 0.5 - held), rel=1e-3)


@pytest.mark.parametrize("details", [
    {"step_s_per_context_token": -0.001, "context_tokens": 48},  # negative growth
    {"step_s_per_context_token": 5.0, "context_tokens": 48},  # 5 s a token: not a measurement
    {"step_s_per_context_token": math.nan, "context_tokens": 48},
    {"step_s_per_context_token": "0.0001", "context_tokens": 48},  # a string
    {"step_s_per_context_token": True, "context_tokens": 48},
    {"step_s_per_context_token": 0.0001},  # no context it was measured at
    {"step_s_per_context_token": 0.0001, "context_tokens": -3},
])
def test_a_bad_context_figure_in_a_calibration_row_is_ignored(reg, multi, registry_url, details) -> None:
    """A hand-edited or foreign calibration row with a context figure that is no measurement leaves the step
    as calibrated: the plan is the one without any context figure."""
    _calibrate(reg, "m", 0.09, **details)
    _calibrate(reg, "p", 0.06)
    data = json.loads(_plan(registry_url, "--engines", "1", "--traffic", "ja=1", "--json").stdout)
    [cell] = data["predicted"]
    assert cell["tps"] == pytest.approx(96 / (110 * 0.003 + 96 / cell["tokens_per_step"] * 0.09), rel=1e-3)
    assert data["assumptions"]["context_ms_per_token"] == 0


def test_context_falls_back_from_the_engine_to_its_vocabulary_to_any_engine_to_none() -> None:
    def inputs(context: dict) -> Inputs:
        return Inputs(offline={}, offline_samples={}, live={}, curves={}, context=context)

    k5 = Candidate("multi-k5", "multi@1", 5, 12288)
    plain = Candidate("no-spec", None, 0, None)
    own, same, other = ContextCost(3e-5, 40), ContextCost(1e-5, 60), ContextCost(8e-5, 50)
    assert context_cost(inputs({(12288, 5): own, (12288, 3): same}), k5) == own
    assert context_cost(inputs({(12288, 3): same, (8192, 3): other}), k5) == same
    mean = context_cost(inputs({(8192, 3): other, (None, 0): own}), k5)
    assert mean.s_per_token == pytest.approx(5.5e-5) and mean.measured_at == pytest.approx(45)
    assert context_cost(inputs({(None, 0): own, (8192, 3): other}), plain) == own
    assert context_cost(inputs({}), plain) == ContextCost()

