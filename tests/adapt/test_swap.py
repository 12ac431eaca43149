"""Swap, rollback and the engines they stop, without real engines: the registry bookkeeping of a promotion that
replaces a language's own deployment, `polyspec adapt rollback` restoring it, and stop-by-pid that only ever
signals a process still looking like that engine. (Real engines: tests/adapt/test_e2e.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polyspec.adapt.canary import CANARY_KEY, CanaryOutcome, Ctx, swap
from polyspec.adapt.cycle import NothingToRollBack, rollback_language
from polyspec.adapt.engines import ENGINE_KEY, drain, owned_pid, stop_pid
from polyspec.adapt.stats import Verdict
from tests.router.fakes import BrokenEngine


def _standin(*args: str) -> subprocess.Popen:
    """A process standing in for an engine's process group leader (its command line names vllm and a port)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", *args], start_new_session=True)


def _evaluate(reg, ref: str, mal: float) -> None:
    p = (mal - 1.0) / 3
    for subset in ("all", "non_degenerate"):
        reg.add_evaluation(ref, benchmark="mtbench-8", language="it", k=3, acceptance=[p, p, p], method="offline",
                           subset=subset)


@pytest.fixture()
def replaced(adapt_reg, settings, fake_draft_dir, tmp_path):
    """Italian served by its own draft (it-draft@1) on an engine whose pid a fleet recorded; a better candidate
    deployed as a canary beside it."""
    old_engine = BrokenEngine("error500").__enter__()  # answers /health: still up for the rollback
    leader = _standin("vllm-standin", "--port", "4321")
    old = adapt_reg.import_draft(fake_draft_dir, verifier="smollm2-135m-instruct", name="it-draft", languages=["it"],
                                 status="active")
    adapt_reg.deploy(old.ref, name="it-engine", url=old_engine.url, languages=["it"],
                     launch={"launched_pid": leader.pid, "port": 4321, "threads": 1})
    cand = adapt_reg.import_draft(fake_draft_dir, verifier="smollm2-135m-instruct", name="adapt-it", languages=["it"],
                                  parent=old.ref)
    _evaluate(adapt_reg, old.ref, 1.3)
    _evaluate(adapt_reg, cand.ref, 1.6)
    adapt_reg.deploy(cand.ref, name="adapt-adapt-it-v1", url="http://127.0.0.1:9", languages=["it"], launch={
        CANARY_KEY: {"language": "it", "share": 0.1, "attempt": "a1"}, ENGINE_KEY: {"pid": None, "port": 9}})
    ctx = Ctx(adapt_reg, settings, "t:1:adapt:x", "a1", "it", "general", home=tmp_path)
    yield adapt_reg, ctx, old, cand, leader
    leader.kill()
    old_engine.__exit__(None, None, None)


def test_swap_replaces_the_languages_own_deployment(replaced) -> None:
    reg, ctx, old, cand, leader = replaced
    outcome = CanaryOutcome("adapt-adapt-it-v1", {"pid": None, "port": 9, "url": "http://127.0.0.1:9"},
                            Verdict("promote", ["better"], []), {"old": {"tokens_per_s": 10}, "candidate": {"tokens_per_s": 12}})
    done = swap(ctx, cand, outcome)
    assert reg.get_draft(cand.ref).status == "active" and reg.get_draft(old.ref).status == "retired"
    active = {d.name: d for d in reg.active_deployments()}
    assert set(active) == {"en-engine", "adapt-adapt-it-v1"} and CANARY_KEY not in active["adapt-adapt-it-v1"].launch
    [moved] = done["replaced"]
    assert moved["deployment"] == "it-engine" and moved["engine"] == "stopped" and moved["retired"]
    assert moved["drain"]["drained"] and leader.wait(5) is not None  # its process group was stopped
    assert done["before"] == {"tokens_per_s": 10} and done["after"] == {"tokens_per_s": 12}
    promote = [e for e in reg.events(20) if e.kind == "promote"][0]
    assert promote.subject == cand.ref and promote.details["comparisons"][0]["baseline"] == old.ref

    ctx.event("swap", "done", **done)
    back = rollback_language(reg, ctx.s, "it", who="t:2:rollback:y", home=ctx.home)
    assert back["restored"] == [{"deployment": "it-engine", "draft": old.ref, "url": moved["url"]}]
    assert {d.name for d in reg.active_deployments()} == {"en-engine", "it-engine"}
    assert reg.get_draft(old.ref).status == "active" and reg.get_draft(cand.ref).status == "retired"
    last = reg.last_adaptation("it", "rollback")
    assert last.details["manual"] and last.who == "t:2:rollback:y" and last.attempt == "a1"
    with pytest.raises(NothingToRollBack, match="rolled back already"):
        rollback_language(reg, ctx.s, "it", who="t:3:rollback:z")


def test_a_refused_promotion_changes_nothing(replaced) -> None:
    from polyspec.registry import PromotionRefused

    reg, ctx, old, cand, _ = replaced
    _evaluate(reg, cand.ref, 1.2)  # now worse than the incumbent on the same key
    before = [(d.name, d.status) for d in reg.deployments(include_stopped=True)]
    with pytest.raises(PromotionRefused):
        swap(ctx, cand, CanaryOutcome("adapt-adapt-it-v1", {}, Verdict("promote", [], []), {}))
    assert [(d.name, d.status) for d in reg.deployments(include_stopped=True)] == before
    assert reg.get_draft(cand.ref).status == "candidate"


def test_rollback_withdraws_a_canary_in_flight(replaced) -> None:
    reg, ctx, old, cand, _ = replaced
    back = rollback_language(reg, ctx.s, "it", who="t:2:rollback:y")
    assert [w["deployment"] for w in back["withdrawn"]] == ["adapt-adapt-it-v1"]
    assert {d.name for d in reg.active_deployments()} == {"en-engine", "it-engine"}
    assert reg.get_draft(cand.ref).status == "retired"


def test_stop_pid_only_signals_the_engine_it_was_told_about() -> None:
    other = _standin("not-an-engine", "--port", "4321")
    wrong_port = _standin("vllm-standin", "--port", "1111")
    try:
        assert "left alone" in stop_pid(other.pid, 4321) and other.poll() is None
        assert "left alone" in stop_pid(wrong_port.pid, 4321) and wrong_port.poll() is None
        stopped = stop_pid(wrong_port.pid, 1111)
        assert stopped == "stopped", (stopped, Path(f"/proc/{wrong_port.pid}/cmdline").read_bytes()
                                      if Path(f"/proc/{wrong_port.pid}").exists() else "gone")
        assert wrong_port.wait(5) is not None
        assert stop_pid(None) == "already stopped" and stop_pid(wrong_port.pid, 1111) == "already stopped"
    finally:
        other.kill()
        wrong_port.kill()


def test_owned_pid_and_drain_without_an_engine() -> None:
    class Dep:
        launch = {ENGINE_KEY: {"pid": 12, "port": 8}}

    assert owned_pid(Dep()) == (12, 8)
    Dep.launch = {"launched_pid": 13, "port": 9}
    assert owned_pid(Dep()) == (13, 9)
    Dep.launch = {"port": 9}
    assert owned_pid(Dep()) == (None, None)
    done = drain("http://127.0.0.1:9", timeout_s=5, quiet_s=0.1)
    assert done["drained"] and "no in-flight count" in done["note"]
