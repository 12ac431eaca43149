"""Failures of an adaptation cycle that need no engine: a full disk, a held adapt lock (another adapt process),
a locked registry, a failing or killed training child, and a canary a dead adapt process left behind. Each
leaves the serving state as it was and records why."""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polyspec.core.errors import InvalidInput
from polyspec.training import traffic
from tests.adapt.conftest import capture_lines, italian, live, snapshot
from tests.cli import polyspec

EN = "en-draft@1"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from polyspec.core.settings import reset_settings_cache

    path = tmp_path / "home"
    monkeypatch.setenv("POLYSPEC_HOME", str(path))
    reset_settings_cache()
    yield path
    reset_settings_cache()


@pytest.fixture()
def triggered(adapt_reg, settings, capture_dir, home):
    """Italian traffic on the English draft, 30 captured Italian prompts: the next cycle trains Italian."""
    live(adapt_reg, "it", EN, 20, mal=1.3)
    capture_lines(capture_dir, "it", italian(30))
    return adapt_reg


def _once(*args: str):
    from polyspec.cli import app

    return CliRunner().invoke(app, ["adapt", *args, "once"], catch_exceptions=False)


def _steps(reg, language: str = "it") -> list[tuple[str, str]]:
    return [(e.step, e.status) for e in reg.adaptation_events(language)]


def test_too_little_free_disk_changes_nothing(triggered, monkeypatch, home) -> None:
    monkeypatch.setenv("POLYSPEC_ADAPT_MIN_FREE_GIB", "1000000")
    before = snapshot(triggered)
    result = _once()
    assert result.exit_code == 1 and "failed" in result.stdout
    assert _steps(triggered) == [("trigger", "done"), ("failed", "failed"), ("training", "failed")]
    failed = triggered.last_adaptation("it", "failed")
    assert failed.details["step"] == "training" and "GiB free" in failed.details["reason"]
    assert snapshot(triggered) == before and not (home / "runs").exists()
    assert triggered.locks() == []  # released


def test_a_disk_that_fills_while_writing_the_data_set(triggered, monkeypatch, home) -> None:
    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(traffic, "_write", full)
    before = snapshot(triggered)
    assert _once().exit_code == 1
    failed = triggered.last_adaptation("it", "failed")
    assert failed.details["reason"].startswith("disk full:") and snapshot(triggered) == before


def _holder(registry_url: str, ttl: float) -> subprocess.Popen:
    """Another adapt process: it takes the lock and keeps it alive until killed."""
    code = ("import sys, time\nfrom polyspec.registry import open_registry\nfrom polyspec.adapt.cycle import LockKeeper\n"
            f"reg = open_registry({registry_url!r})\n"
            f"with LockKeeper(reg, 'other-host:1:adapt:x', {ttl}):\n    print('held', flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_two_adapt_processes_only_one_acts(triggered, registry_url, monkeypatch) -> None:
    other = _holder(registry_url, ttl=6.0)  # renewed every 2 s while it lives: a starved beat still keeps it
    try:
        before = snapshot(triggered)
        done = polyspec("adapt", "once")  # this process, against the holder's
        assert done.returncode == 4, done.stderr
        assert "held by other-host:1:adapt:x" in done.stderr
        refused = triggered.last_adaptation("*", "lock")
        assert refused.status == "refused" and "another adapt process acts" in refused.details["reason"]
        assert snapshot(triggered) == before and _steps(triggered) == []
    finally:
        other.send_signal(signal.SIGKILL)  # it dies holding the lease
        other.wait(10)
    deadline = time.monotonic() + 30
    while not all(lock["stale"] for lock in triggered.locks()):  # the dead holder's lease runs out
        assert time.monotonic() < deadline, triggered.locks()
        time.sleep(0.1)
    monkeypatch.setenv("POLYSPEC_ADAPT_MIN_FREE_GIB", "1000000")  # so the cycle stops early, recorded
    assert _once().exit_code == 1
    takeover = [e for e in triggered.events(50) if e.kind == "adapt-lock" and "previous_holder" in e.details]
    assert takeover and takeover[0].details["previous_holder"] == "other-host:1:adapt:x"
    assert ("trigger", "done") in _steps(triggered)


def test_a_locked_registry_changes_nothing_and_is_recorded(triggered, registry_url, monkeypatch) -> None:
    from polyspec.registry import db

    monkeypatch.setattr(db, "BUSY_TIMEOUT_MS", 300)  # a writer waits 0.3 s for the lock, not 30 s
    path = registry_url.removeprefix("sqlite:///")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        release.wait(10)
        conn.execute("ROLLBACK")
        conn.close()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    before = snapshot(triggered)
    threading.Timer(2.0, release.set).start()
    result = _once()
    holder.join()
    assert result.exit_code == 5 and "registry is locked" in result.output
    note = triggered.last_adaptation("*", "lock")
    assert note.status == "failed" and "registry locked" in note.details["reason"]
    assert snapshot(triggered) == before and _steps(triggered) == [] and triggered.locks() == []


def test_a_failing_training_child_is_recorded_and_resumed_next_cycle(triggered, monkeypatch, home, verifier) -> None:
    from polyspec.adapt.settings import AdaptSettings
    from polyspec.adapt.triggers import assess

    triggered.add_verifier(verifier, name="smollm2-135m-instruct-real")  # the real tokenizer profiles Italian
    monkeypatch.setenv("POLYSPEC_DEFAULT_VERIFIER", "smollm2-135m-instruct-real")
    monkeypatch.setenv("POLYSPEC_ADAPT_ANSWERS", "offline")
    monkeypatch.setenv("POLYSPEC_ADAPT_TRAIN_COMMAND", "echo boom {run_id}; exit 3")
    from polyspec.core.settings import reset_settings_cache

    reset_settings_cache()
    before = snapshot(triggered)
    result = _once()
    assert result.exit_code == 0 and "interrupted" in result.stdout
    started = triggered.last_adaptation("it", "training", status="started")
    run_id = started.details["run_id"]
    assert started.details["dataset"]["train"] + started.details["dataset"]["heldout"] == 30
    assert started.details["plan"]["mode"] in ("finetune", "from-scratch")
    stopped = triggered.last_adaptation("it", "training")
    assert stopped.status == "interrupted" and f"boom {run_id}" in stopped.details["reason"]
    assert "exited with 3" in stopped.details["reason"]
    assert snapshot(triggered)["deployments"] == before["deployments"]
    action = assess(triggered, AdaptSettings()).chosen
    assert action.decision == "resume" and action.resume["run_id"] == run_id
    Path(started.details["dataset"]["heldout_path"]).write_text("changed\n")  # the data set may not change
    result = _once()
    assert "data set changed" in triggered.last_adaptation("it", "training").details["reason"]


def test_a_killed_training_child_is_interrupted(triggered, monkeypatch, home, verifier) -> None:
    triggered.add_verifier(verifier, name="smollm2-135m-instruct-real")
    monkeypatch.setenv("POLYSPEC_DEFAULT_VERIFIER", "smollm2-135m-instruct-real")
    monkeypatch.setenv("POLYSPEC_ADAPT_TRAIN_COMMAND", "sleep 300")
    from polyspec.core.settings import reset_settings_cache

    reset_settings_cache()

    def kill_when_started() -> None:
        for _ in range(600):
            event = triggered.last_adaptation("it", "training", status="started")
            if event is not None:
                os.killpg(event.details["pid"], signal.SIGKILL)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_when_started)
    killer.start()
    result = _once()
    killer.join()
    assert result.exit_code == 0
    stopped = triggered.last_adaptation("it", "training")
    assert stopped.status == "interrupted" and "killed by signal 9" in stopped.details["reason"]


def test_a_canary_left_by_a_dead_adapt_is_withdrawn(triggered, settings, fake_draft_dir, home) -> None:
    from polyspec.adapt.cycle import run_cycle

    cand = triggered.import_draft(fake_draft_dir, verifier="smollm2-135m-instruct", name="adapt-it", languages=["it"])
    # An exited engine left unreaped: a zombie keeps its pid, so no new process can take it before the cycle
    # looks (pids wrap at 32768 on CI machines; a reaped pid can go to a new process, which the cycle then
    # rightly leaves alone instead of saying "already stopped").
    dead = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{dead.pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
        assert time.monotonic() < deadline, "`true` did not exit"
        time.sleep(0.01)
    triggered.deploy(cand.ref, name="adapt-adapt-it-v1", url="http://127.0.0.1:9", languages=["it"], launch={
        "canary": {"language": "it", "share": 0.1, "attempt": "adapt-it-old"},
        "adapt_engine": {"pid": dead.pid, "port": 9, "url": "http://127.0.0.1:9"}})
    os.environ["POLYSPEC_ADAPT_MIN_FREE_GIB"] = "1000000"
    try:
        result = run_cycle(triggered, settings.model_copy(update={"min_free_gib": 1e6}), who="t")
    finally:
        del os.environ["POLYSPEC_ADAPT_MIN_FREE_GIB"]
        dead.wait()
    assert result.details.get("step") == "training"  # the cycle went on after the clean-up
    assert [d.name for d in triggered.active_deployments()] == ["en-engine"]
    assert triggered.get_draft(cand.ref).status == "retired"
    rollback = triggered.last_adaptation("it", "rollback")
    assert rollback.attempt == "adapt-it-old" and rollback.details["engine"] == "already stopped"
    assert "did not finish" in rollback.details["why"]


def test_rollback_without_a_swap_is_not_found(adapt_reg, settings, home) -> None:
    from polyspec.cli import app

    result = CliRunner().invoke(app, ["adapt", "rollback", "it"])
    assert result.exit_code == 3 and "no swap of it" in result.output
    bad = CliRunner().invoke(app, ["adapt", "rollback", "not-a-language"])
    assert bad.exit_code == 2


def test_history_and_status_read_the_audit_trail(adapt_reg, settings, home) -> None:
    from polyspec.cli import app

    adapt_reg.record_adaptation("trigger", "it", who="t", attempt="a1", triggers=[{"why": "slow it"}])
    adapt_reg.record_adaptation("gate", "it", who="t", attempt="a1", status="failed", comparisons=[
        {"language": "it", "benchmark": "mtbench-8", "subset": "all", "before": 1.2, "after": 1.21, "change": 0.01}])
    table = CliRunner().invoke(app, ["adapt", "history", "it"], catch_exceptions=False)
    assert "slow it" in table.stdout and "mtbench-8 all: 1.2->1.21" in table.stdout
    data = json.loads(CliRunner().invoke(app, ["adapt", "history", "--json"], catch_exceptions=False).stdout)
    assert [(e["step"], e["status"], e["attempt"]) for e in data] == [("trigger", "done", "a1"), ("gate", "failed", "a1")]
    status = json.loads(CliRunner().invoke(app, ["adapt", "status", "--json"], catch_exceptions=False).stdout)
    assert status == {"locks": [], "canaries": [], "trainings": []}


def test_status_lists_only_unfinished_trainings(adapt_reg, settings, home) -> None:
    from polyspec.cli import app

    adapt_reg.record_adaptation("training", "it", who="t", attempt="a1", status="started", run_id="r1")
    adapt_reg.record_adaptation("training", "it", who="t", attempt="a1", status="done", run_id="r1")
    adapt_reg.record_adaptation("training", "de", who="t", attempt="a2", status="interrupted", run_id="r2")
    adapt_reg.acquire_lock("adapt", "host:1:adapt:x", 60)
    status = json.loads(CliRunner().invoke(app, ["adapt", "status", "--json"], catch_exceptions=False).stdout)
    assert [(t["language"], t["status"]) for t in status["trainings"]] == [("de", "interrupted")]
    assert [lock["holder"] for lock in status["locks"]] == ["host:1:adapt:x"]


def test_every_runs_cycles_until_interrupted(adapt_reg, settings, home, registry_url) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "polyspec.cli", "adapt", "--every", "10s", "--json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()

    def cycles_printed() -> int:
        return sum('"status": "nothing"' in line for line in list(lines))

    try:
        deadline = time.monotonic() + 120
        while cycles_printed() < 2:  # the cycle at once, then the one 10 s later
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "two cycles were not printed within 120 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # as Ctrl-C, well before a third cycle is due
        proc.wait(timeout=60)
        reader.join(timeout=60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "adapt: stopped" in err, err[-2000:]
    assert cycles_printed() == 2  # at 0 s and at 10 s
    observed = [e for e in adapt_reg.events(100) if e.kind == "adapt-observe"]
    assert len(observed) == 2 and adapt_reg.locks() == []


def test_up_adapt_every_runs_the_loop_beside_the_router_and_stops_it(adapt_reg, settings, home, registry_url,
                                                                    tmp_path, monkeypatch) -> None:
    """`polyspec up --adapt-every`: the child refreshes the router it was started for, runs a cycle at once,
    and ends (lock released) when the fleet stops."""
    from polyspec.adapt.cli import AdaptLoop, parse_every

    monkeypatch.delenv("POLYSPEC_ADAPT_ROUTER_URLS", raising=False)
    log = tmp_path / "logs" / "adapt.log"
    loop = AdaptLoop(parse_every("10s"), registry_url, log)
    loop.start("http://127.0.0.1:9")
    try:
        deadline = time.monotonic() + 60
        while not [e for e in adapt_reg.events(100) if e.kind == "adapt-observe"]:
            assert loop.proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
    finally:
        loop.stop(timeout=60)
    assert loop.proc.returncode == 0 and "adapt: stopped" in log.read_text()
    assert adapt_reg.locks() == []
    loop.stop()  # a second stop is a no-op
    with pytest.raises(InvalidInput):
        parse_every("1s")
