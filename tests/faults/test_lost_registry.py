"""The registry lost, emptied or hung under a running router (and missing at its start).

The router never creates a registry. When it loses it, or the registry suddenly lists no deployment, it
keeps routing with its last good table, says so on /ready (503, with the reason and what to do), in the
log and in metrics, and takes the registry back once it is there again. The replica is the fake engine
in "slow" mode: a correct, short stream (no real engine is needed to show where requests go).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.conftest import ServedApp, router_config, serve_router, wait_for
from tests.router.fakes import BrokenEngine


def _metric(url: str, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def _stream_answer(url: str) -> tuple[int, str | None, list[str]]:
    """A short streamed chat through the router: (status, backend, SSE data lines)."""
    body = {"model": "polyspec", "stream": True, "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hello, how are you today?"}]}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as resp:
        lines = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        return resp.status_code, resp.headers.get("x-polyspec-backend"), lines


def _db_files(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in ("", "-wal", "-shm")]


def test_registry_deleted_under_running_router(fake_replica, registry, registry_url, caplog):
    caplog.set_level(logging.WARNING, logger="polyspec.router")
    path = Path(registry_url.removeprefix("sqlite:///"))
    with serve_router(registry_url, refresh_interval_s=0.2) as router:
        assert wait_for(lambda: httpx.get(f"{router.url}/ready").status_code == 200, 10)
        for file in _db_files(path):
            file.unlink(missing_ok=True)

        def not_ready() -> dict:
            resp = httpx.get(f"{router.url}/ready")
            return resp.json() if resp.status_code == 503 else {}

        assert wait_for(lambda: "missing" in (not_ready().get("reason") or ""), 10)
        ready = not_ready()
        assert "polyspec registry init" in ready["reason"]
        assert "serving the last good table of 1 pools" in ready["reason"]
        assert ready["pools"] == 1 and ready["table_stale"] is True
        # A few more refreshes: none may bring the file back, each says the same.
        failed = _metric(router.url, "polyspec_registry_refresh_failures_total", reason="missing")
        assert wait_for(lambda: _metric(router.url, "polyspec_registry_refresh_failures_total", reason="missing")
                        >= failed + 3, 10)
        assert not any(f.exists() for f in _db_files(path))
        assert "is missing (deleted or moved)" in not_ready()["reason"]
        status, backend, lines = _stream_answer(router.url)
        assert (status, backend, lines[-1]) == (200, "fake-1", "[DONE]")
        assert _metric(router.url, "polyspec_registry_refresh_failures_total", reason="missing") >= 1
        assert _metric(router.url, "polyspec_routing_table_stale") == 1
        assert _metric(router.url, "polyspec_ready") == 0
        assert httpx.get(f"{router.url}/health").status_code == 200
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "missing" in r.getMessage()]
    assert errors, caplog.text
    assert not any(f.exists() for f in _db_files(path))


def test_registry_emptied_keeps_last_good_table_until_a_good_refresh(fake_replica, registry, registry_url, caplog):
    """Every deployment undeployed, then the file replaced by a fresh, empty registry: both times the
    router refuses the empty table; a registry with deployments again clears it."""
    from polyspec.registry import open_registry

    caplog.set_level(logging.ERROR, logger="polyspec.router")
    path = Path(registry_url.removeprefix("sqlite:///"))
    with serve_router(registry_url, refresh_interval_s=0.2) as router:
        assert wait_for(lambda: httpx.get(f"{router.url}/ready").status_code == 200, 10)
        registry.undeploy("fake-1")

        def reason() -> str:
            return httpx.get(f"{router.url}/ready").json()["reason"] or ""

        assert wait_for(lambda: "no active deployments" in reason(), 10)
        assert "serving the last good table of 1 pools from " in reason()
        assert httpx.get(f"{router.url}/ready").status_code == 503
        assert _stream_answer(router.url)[:2] == (200, "fake-1")
        assert _metric(router.url, "polyspec_registry_refresh_failures_total", reason="empty") >= 1
        assert _metric(router.url, "polyspec_routing_table_stale") == 1
        assert "routing table refresh refused" in caplog.text

        registry.deploy(None, name="fake-1", url=fake_replica.url, languages=["en"], default=True)
        assert wait_for(lambda: httpx.get(f"{router.url}/ready").status_code == 200, 10)
        assert _metric(router.url, "polyspec_routing_table_stale") == 0

        # A valid registry without deployments put in place of the file (a wrong backup restored).
        fresh = path.with_name("fresh.db")
        open_registry(f"sqlite:///{fresh}").close()
        for file in _db_files(path)[1:]:
            file.unlink(missing_ok=True)
        os.replace(fresh, path)
        assert wait_for(lambda: "no active deployments" in reason(), 10)
        assert _stream_answer(router.url)[:2] == (200, "fake-1")
        assert router.runtime.table.pools and router.runtime.table_stale


def test_router_started_without_a_registry(tmp_path, fake_verifier, caplog):
    caplog.set_level(logging.ERROR, logger="polyspec.router")
    path = tmp_path / "nowhere" / "registry.db"
    url = f"sqlite:///{path}"
    with serve_router(url, refresh_interval_s=0.2) as router:
        assert httpx.get(f"{router.url}/health").status_code == 200
        ready = httpx.get(f"{router.url}/ready")
        assert ready.status_code == 503
        assert "does not exist" in ready.json()["reason"] and "polyspec registry init" in ready.json()["reason"]
        assert _metric(router.url, "polyspec_registry_refresh_failures_total", reason="missing") >= 1
        failed = _metric(router.url, "polyspec_registry_refresh_failures_total", reason="missing")
        assert wait_for(lambda: _metric(router.url, "polyspec_registry_refresh_failures_total", reason="missing")
                        >= failed + 2, 10)  # more refreshes, each refused
        assert not path.parent.exists()  # neither the file nor its directory
        assert "does not exist" in caplog.text

        # `polyspec registry init`, then a deployment: the router takes it up at its next refresh.
        env = {**os.environ, "POLYSPEC_REGISTRY_URL": url}
        init = subprocess.run([Path(sys.executable).parent / "polyspec", "registry", "init", "--json"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert init.returncode == 0, init.stderr
        assert wait_for(lambda: "no active deployments" in (httpx.get(f"{router.url}/ready").json()["reason"] or ""), 10)
        from polyspec.registry import open_registry

        with BrokenEngine("slow", slow_interval_s=0.01) as fake, open_registry(url) as reg:
            reg.add_verifier(fake_verifier)
            reg.deploy(None, name="fake-1", url=fake.url, languages=["en"], default=True)
            assert wait_for(lambda: httpx.get(f"{router.url}/ready").status_code == 200, 10)
            assert _stream_answer(router.url)[:2] == (200, "fake-1")


LOCKER = r"""
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA locking_mode=EXCLUSIVE")  # in WAL mode too, readers are locked out
con.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
con.execute("ROLLBACK")
"""


def test_hung_registry_never_piles_up_refreshes(fake_replica, registry, registry_url, monkeypatch):
    """The registry locked for every reader: callers of refresh (the timer, the admin button) wait one
    bounded period each, and only one refresh runs against the registry until it answers."""
    from polyspec.router.app import create_app
    from polyspec.router.source import RegistrySource

    monkeypatch.setattr("polyspec.registry.db.BUSY_TIMEOUT_MS", 4000)  # a read blocked 4 s, then an error

    class Counting(RegistrySource):
        """The real source, counting the reads that reach the registry (running at once and in all)."""

        def __init__(self, url: str) -> None:
            super().__init__(url)
            self.running = self.peak = self.calls = 0
            self._count = threading.Lock()

        def deployments(self):
            with self._count:
                self.calls += 1
                self.running += 1
                self.peak = max(self.peak, self.running)
            try:
                return super().deployments()
            finally:
                with self._count:
                    self.running -= 1

    source = Counting(registry_url)
    app = create_app(router_config(registry_url, refresh_interval_s=0.25), source=source, mount_admin=False)
    path = Path(registry_url.removeprefix("sqlite:///"))
    with ServedApp(app) as router:
        rt = router.runtime
        loop = rt._tasks[0].get_loop()
        assert wait_for(lambda: httpx.get(f"{router.url}/ready").status_code == 200, 10)
        # A WAL database cannot be locked for readers while a connection has it open (each holds a shared
        # lock), so a copy is locked first and then put in place: the router reopens the replaced file.
        copy = path.with_name("copy.db")
        with closing(sqlite3.connect(path)) as live, closing(sqlite3.connect(copy)) as target:
            live.backup(target)
        locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(copy)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert locker.stdout.readline().strip() == "locked"
            os.replace(copy, path)
            for file in _db_files(path)[1:]:
                file.unlink(missing_ok=True)
            assert wait_for(lambda: source.running == 1, 5, 0.01), (rt.last_refresh_error, source.calls, rt.table.pools)
            time.sleep(0.5)
            assert source.running == 1  # the timer's refresh is stuck in the registry
            calls = source.calls
            started = time.monotonic()

            async def five_refreshes() -> list[dict]:
                return await asyncio.gather(*(rt.refresh() for _ in range(5)))

            results = asyncio.run_coroutine_threadsafe(five_refreshes(), loop).result(10)
            assert time.monotonic() - started < 1.5  # each waited one period (0.25 s), not for the lock
            assert all(not r["ok"] and "did not answer" in r["error"] for r in results)
            t0 = time.monotonic()
            assert httpx.get(f"{router.url}/health", timeout=5).status_code == 200
            assert time.monotonic() - t0 < 0.5
            time.sleep(1.0)  # the timer ticks on (every 0.25 s) while the registry stays locked (4 s)
            assert source.calls == calls and source.peak == 1
            assert _stream_answer(router.url)[:2] == (200, "fake-1")
            assert _metric(router.url, "polyspec_registry_refresh_failures_total", reason="timeout") == 1
        finally:
            locker.stdin.close()
            locker.wait(10)
        unlocked = time.time()
        # Unlocked: the hung read ends (answered or "database is locked"), and the next refresh succeeds.
        assert wait_for(lambda: (rt.last_refresh or 0) > unlocked, 15)
        ready = httpx.get(f"{router.url}/ready")
        assert ready.status_code == 200 and ready.json()["table_stale"] is False
        assert source.peak == 1


def test_a_registry_in_use_is_closed_by_its_last_call_never_under_it(registry, registry_url):
    """A failing call (the stats flush on a locked registry) drops the registry while the refresh thread is
    still querying it: the registry is closed when that query ends, not under it (closing a SQLite connection
    in use from another thread crashed the router's process), and the next call opens a fresh one."""
    from polyspec.router.source import RegistrySource

    entered, leave = threading.Event(), threading.Event()
    opened: list[Any] = []

    class Held:
        """The real registry, with a query that waits and a write that fails as a locked database does."""

        def __init__(self, real: Any) -> None:
            self.real, self.closed = real, False

        def active_deployments(self) -> Any:
            entered.set()
            assert leave.wait(10)
            assert not self.closed, "closed while a query ran on it"
            return self.real.active_deployments()

        def record_live_stats(self, router_id: str, rows: Any) -> None:
            raise sqlite3.OperationalError("database is locked")

        def close(self) -> None:
            self.closed = True
            self.real.close()

    class Source(RegistrySource):
        def _reg_locked(self) -> Any:
            if self._registry is None:
                super()._reg_locked()
                self._registry = Held(self._registry)
                opened.append(self._registry)
            return self._registry

    source = Source(registry_url)
    reader = threading.Thread(target=source.deployments)
    reader.start()
    assert entered.wait(10)
    with pytest.raises(sqlite3.OperationalError):
        source.record_live_stats("r1", [])
    assert not opened[0].closed  # dropped, but still in use by the reader
    leave.set()
    reader.join(10)
    assert opened[0].closed  # closed by its last call
    entered.clear()
    threading.Thread(target=leave.set).start()
    source.deployments()  # a fresh registry
    assert len(opened) == 2 and not opened[1].closed
