"""bench/fleet_online.py: the fleet bench's online prediction uses only the requests before each one, and a
calibration merged with its repeat."""

from __future__ import annotations

import pytest

from bench.fleet_figures import language_figures, targets, weighted_figures
from bench.fleet_online import Online, merge_points
from polyspec.core.speed import ContextCost, request_seconds

CONTEXT = ContextCost(0.0001, 50)


def _row(backend: str, seconds: float, tokens: int = 96, steps: int = 32, ok: bool = True) -> dict:
    return {"ok": ok, "backend": backend, "seconds": seconds, "tokens": tokens, "spec_steps": steps}


def test_the_first_request_gets_the_offline_model_and_later_ones_the_counts_before_them() -> None:
    online = Online({("m", "fr"): (3.0, 0.08, 0.003, CONTEXT)}, prior_steps=100, prior_requests=4)
    first = online.seconds(_row("m", 4.0), "fr", 110)
    assert first == pytest.approx(request_seconds(3.0, 0.08, answer_tokens=96, prompt_tokens=110,
                                                  prefill_s_per_token=0.003, context=CONTEXT))
    second = online.seconds(_row("m", 4.0), "fr", 110)
    # acceptance: 100 offline steps at 3.0 and the first request's 96 tokens in 32 steps
    e = (100 * 3.0 + 96) / (100 + 32)
    # step: four calibrated requests and the first one's own, its prefill taken out, at calibration's context
    own = (4.0 - 110 * 0.003) / 32 - 0.0001 * (110 + 48 - 50)
    step = (4 * 0.08 + own) / 5
    assert second == pytest.approx(request_seconds(e, step, answer_tokens=96, prompt_tokens=110,
                                                   prefill_s_per_token=0.003, context=CONTEXT))


def test_counts_are_kept_per_engine_and_language_and_bad_rows_predict_nothing() -> None:
    online = Online({("m", "fr"): (3.0, 0.08, 0.003, CONTEXT), ("m", "ja"): (2.0, 0.08, 0.003, CONTEXT),
                     ("p", "fr"): (1.0, 0.06, 0.003, CONTEXT)}, prior_steps=100, prior_requests=4)
    ja_before = request_seconds(2.0, 0.08, answer_tokens=96, prompt_tokens=110, prefill_s_per_token=0.003,
                                context=CONTEXT)
    online.seconds(_row("m", 12.0, steps=96), "fr", 110)  # a slow French request with nothing accepted
    ja = online.seconds(_row("m", 4.0), "ja", 110)
    assert ja > ja_before  # the engine's step is shared by its languages; French acceptance is not
    assert online.counted[("m", "ja")] == [96, 32] and online.counted[("m", "fr")] == [96, 96]
    assert online.seconds(_row("m", 4.0, ok=False), "fr", 110) is None
    assert online.seconds(_row("x", 4.0), "fr", 110) is None  # an engine the model does not know
    assert online.seconds(_row("m", 4.0, tokens=0), "fr", 110) is None
    # no speculation: tokens per step stay 1, steps are its tokens
    plain = online.seconds(_row("p", 6.0, steps=0), "fr", 110)
    assert plain == pytest.approx(request_seconds(1.0, 0.06, answer_tokens=96, prompt_tokens=110,
                                                  prefill_s_per_token=0.003, context=CONTEXT))
    assert ("p", "fr") not in online.counted and online.steps["p"][1] == 1


def test_a_calibration_and_its_repeat_merge_into_one_point_that_keeps_the_ratio() -> None:
    first = [{"batch_size": 1, "step_s": 0.08, "tokens_per_s": 20.0, "requests": 4,
              "details": {"prefill_s_per_token": 0.004, "step_s_per_context_token": 0.0001, "context_tokens": 50}}]
    repeat = [{"batch_size": 1, "step_s": 0.10, "tokens_per_s": 16.0, "requests": 4,
               "details": {"prefill_s_per_token": 0.002, "context_tokens": 52}}]
    [point] = merge_points(first, repeat)
    assert point["step_s"] == pytest.approx(0.09) and point["requests"] == 8 and point["tokens_per_s"] == 18.0
    d = point["details"]
    assert d["prefill_s_per_token"] == pytest.approx(0.003) and d["context_tokens"] == 51
    assert d["step_s_per_context_token"] == 0.0001  # measured once: kept as it was
    assert d["repeat_step_ratio"] == pytest.approx(1.25)
    assert merge_points(first, []) == first
    fitted = [{**first[0], "details": {**first[0]["details"], "overhead_s": 0.3, "decode_step_s": 0.07}}]
    again = [{**repeat[0], "details": {**repeat[0]["details"], "overhead_s": 0.5, "decode_step_s": 0.09}}]
    d = merge_points(fitted, again)[0]["details"]
    assert d["overhead_s"] == pytest.approx(0.4) and d["decode_step_s"] == pytest.approx(0.08)


def test_the_online_target_is_judged_apart_from_the_offline_one() -> None:
    rows = []
    for n in range(6):
        for system, tps in (("no_spec", 10.0), ("specialist_fleet", 12.0), ("planned_fleet", 16.0)):
            seconds = 60 / tps
            rows.append({"language": "fr", "prompt_id": f"fr-{n}", "system": system, "ok": True, "tokens": 60,
                         "seconds": seconds, "backend": system, "slot": 0, "histogram": [], "spec_steps": 0,
                         "misrouted": False, "predicted_seconds": seconds / 1.2,
                         "predicted_seconds_online": seconds / 1.05})
    langs = {"fr": language_figures(rows, "fr", k=3)}
    assert langs["fr"]["predicted_online_over_observed"]["planned_fleet"] == pytest.approx(1.05)
    w = weighted_figures(langs, rows, {"fr": 1.0}, {"no_spec": 1, "specialist_fleet": 5, "planned_fleet": 2})
    t = targets(langs, w)
    assert not t["predictions"]["met"] and t["predictions_online"]["met"]


def test_a_cell_s_mean_acceptance_length_counts_every_bucket_of_a_deeper_engine() -> None:
    """The planned fleet's k = 4 engine reports five histogram buckets; a cell judged at the run's k = 3 keeps them."""
    rows = [{"language": "fr", "prompt_id": f"fr-{n}", "system": system, "ok": True, "tokens": 96, "seconds": 4.0,
             "backend": system, "slot": 0, "histogram": hist, "spec_steps": sum(hist), "misrouted": False,
             "model_tokens_per_step": 3.3 if hist else 1.0}
            for n in range(2) for system, hist in (("no_spec", []), ("specialist_fleet", [10, 10, 10, 10]),
                                                   ("planned_fleet", [10, 0, 0, 0, 10]))]
    mal = language_figures(rows, "fr", k=3)["mean_acceptance_length"]
    assert mal["planned_fleet"] == pytest.approx(3.0) and mal["specialist_fleet"] == pytest.approx(2.5)
    assert language_figures(rows, "fr", k=3)["model_tokens_per_step"]["planned_fleet"] == pytest.approx(3.3)


def test_end_by_is_the_next_such_time_even_across_midnight() -> None:
    """--end-by 00:52 given at 23:47 means the coming 00:52, not the one that passed 23 hours ago (read so, a run
    stops before its first round; the bench now also refuses to write a run without rows)."""
    from datetime import datetime, timezone

    import typer

    from bench.fleet_plan import next_time

    late = datetime(2026, 12, 7, 23, 47, tzinfo=timezone.utc)
    assert next_time("00:52", late) == datetime(2026, 12, 8, 0, 52, tzinfo=timezone.utc).timestamp()
    assert next_time("23:59", late) == datetime(2026, 12, 7, 23, 59, tzinfo=timezone.utc).timestamp()
    for bad in ("25:00", "12:75", "noon"):
        with pytest.raises(typer.BadParameter, match="HH:MM"):
            next_time(bad, late)
