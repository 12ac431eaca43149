"""bench/calibration_check.py's summary and option checks (no engine: the run itself is the bench)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bench import calibration_check


def _row(engine: str, lang: str, seconds: float, predicted: float, unanchored: float, steps: int) -> dict:
    return {"engine": engine, "language": lang, "seconds": seconds, "steps": steps, "predicted_seconds": predicted,
            "predicted_seconds_unanchored": unanchored, "raw_completion_step_s": 0.06, "calibrated_step_s": 0.07,
            "calibrated_prompt_tokens": 140.0, "calibrated_prefill_s_per_token": 0.0023}


def test_summary_gives_predicted_over_observed_seconds_per_engine_and_language() -> None:
    rows = [_row("multi-k4", "fr", 2.0, 2.2, 2.4, 30), _row("multi-k4", "ja", 3.0, 2.7, 3.3, 40),
            _row("de-k3", "fr", 1.0, 1.0, 1.1, 20)]
    s = calibration_check.summary(rows)
    assert s["multi-k4"]["predicted_over_observed"] == pytest.approx(4.9 / 5.0)
    assert s["multi-k4"]["unanchored_over_observed"] == pytest.approx(5.7 / 5.0)
    assert s["multi-k4"]["per_language"] == {"fr": 1.1, "ja": 0.9}
    assert s["multi-k4"]["chat_step_ms"] == pytest.approx(1e3 * 5.0 / 70, abs=0.05)
    assert s["de-k3"]["requests"] == 1 and s["de-k3"]["calibrated_step_ms"] == 70.0


@pytest.mark.parametrize("drafts", ["multi", "multi:x", ":3", "multi:0"])
def test_a_bad_drafts_option_is_refused_before_any_engine_starts(drafts: str, monkeypatch) -> None:
    monkeypatch.setattr(calibration_check, "check_engine", lambda *a: pytest.fail("an engine was started"))
    import typer

    app = typer.Typer()
    app.command()(calibration_check.main)
    result = CliRunner().invoke(app, ["--drafts", drafts])
    assert result.exit_code == 2 and "DRAFT:K" in result.output
