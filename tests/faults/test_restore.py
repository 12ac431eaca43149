"""A registry restored while readers run.

A restore that creates its target and then writes it (`cp`, `shutil.copy`) leaves an empty file for a
moment. A reader that opened it then used to switch it to WAL, which writes an empty database's first
page: landing after the copy's own writes, that page erased the restored tables. The interleaving is
forced here with SQLite's own locks, not hoped for: a connection holding a read lock keeps the reader's
write waiting while the copy writes, exactly the window of the race. Readers (``create=False``: the
router, the dashboard) now write nothing and refuse a file without a SQLite header.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.conftest import serve_router, wait_for
from tests.faults.test_lost_registry import _db_files, _metric, _stream_answer


def _backup(source_url: str, target: Path) -> bytes:
    """A consistent copy of a live registry (SQLite's backup API), as an operator's backup would be."""
    with closing(sqlite3.connect(source_url.removeprefix("sqlite:///"))) as live, \
            closing(sqlite3.connect(target)) as copy:
        live.backup(copy)
    return target.read_bytes()


def _write_locked(path: Path) -> bool:
    """Whether another connection holds the file's write lock (a reader busy writing it)."""
    with closing(sqlite3.connect(path, isolation_level=None, timeout=0)) as probe:
        try:
            probe.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            return "locked" in str(exc)
        probe.execute("ROLLBACK")
        return False


def test_a_reader_that_opens_a_restore_in_progress_writes_nothing(registry, registry_url, tmp_path):
    from polyspec.registry import RegistryMissing, open_registry

    restored = _backup(registry_url, tmp_path / "backup.db")
    path = tmp_path / "restored.db"
    path.touch()  # the copy has created its target and not written it yet
    url = f"sqlite:///{path}"
    # A read transaction on the empty file: a writer's commit must wait for it. Without it the window
    # between a reader's look at the empty file and its write is a few microseconds inside SQLite.
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN")
    holder.execute("SELECT count(*) FROM sqlite_master").fetchall()
    outcome: dict[str, Any] = {}

    def reader() -> None:  # the router's refresh, opening the registry inside the window
        try:
            open_registry(url, create=False).close()
            outcome["opened"] = True
        except Exception as exc:  # noqa: BLE001 - judged below
            outcome["error"] = exc

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        # Either the reader gave up at once, or it is writing (holds the write lock, waits for the holder).
        assert wait_for(lambda: not thread.is_alive() or _write_locked(path), 10, 0.01)
        with path.open("r+b") as file:  # the copy writes the backup's bytes
            file.write(restored)
    finally:
        holder.execute("COMMIT")
        holder.close()
        thread.join(30)
    assert isinstance(outcome.get("error"), RegistryMissing), outcome
    assert "is empty (0 bytes)" in str(outcome["error"]) and "temporary name" in str(outcome["error"])
    assert path.read_bytes() == restored  # the reader wrote nothing, not even a WAL switch
    assert not any(f.exists() for f in _db_files(path)[1:])
    with open_registry(url, create=False) as reg:
        assert [v.name for v in reg.verifiers()] == [v.name for v in registry.verifiers()]


@pytest.mark.parametrize("content", [b"", b"SQLite format 3\x00", b"not a database\n" * 40])
def test_a_reader_refuses_a_file_without_a_sqlite_header(tmp_path, content):
    from polyspec.registry import RegistryMissing, open_registry

    path = tmp_path / "registry.db"
    path.write_bytes(content)
    with pytest.raises(RegistryMissing, match="empty|too short|not a SQLite database") as caught:
        open_registry(f"sqlite:///{path}", create=False)
    assert "polyspec registry init" in str(caught.value)
    assert path.read_bytes() == content and not any(f.exists() for f in _db_files(path)[1:])


def test_only_init_turns_an_empty_file_into_a_registry(tmp_path):
    """`polyspec registry init` (create=True) may initialise an empty file, and switches it to WAL."""
    from polyspec.registry import open_registry

    path = tmp_path / "registry.db"
    path.touch()
    with open_registry(f"sqlite:///{path}") as reg:
        assert reg.verifiers() == []
    with closing(sqlite3.connect(path)) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_router_keeps_its_table_through_an_empty_registry_file(fake_replica, registry, registry_url, tmp_path):
    """The registry deleted, then a restore's empty target in its place, then the bytes: the router keeps
    serving its last table, /ready says why at each step, and it reads the restored registry intact."""
    from polyspec.registry import open_registry

    path = Path(registry_url.removeprefix("sqlite:///"))
    restored = _backup(registry_url, tmp_path / "backup.db")
    with serve_router(registry_url, refresh_interval_s=0.2) as router:
        rt = router.runtime
        assert wait_for(lambda: httpx.get(f"{router.url}/ready").status_code == 200, 10)

        def reason() -> str:
            return httpx.get(f"{router.url}/ready").json()["reason"] or ""

        for file in _db_files(path):
            file.unlink(missing_ok=True)
        assert wait_for(lambda: "is missing" in reason(), 10)
        path.touch()  # `cp BACKUP registry.db` has begun
        assert wait_for(lambda: "is empty (0 bytes)" in reason(), 10), reason()
        # Refused at every refresh, never initialised: the file stays empty, no -wal or -shm appears.
        refusals = _metric(router.url, "polyspec_registry_refresh_failures_total", reason="missing")
        assert wait_for(lambda: _metric(router.url, "polyspec_registry_refresh_failures_total", reason="missing")
                        >= refusals + 3, 10)
        assert path.stat().st_size == 0 and not any(f.exists() for f in _db_files(path)[1:])
        ready = httpx.get(f"{router.url}/ready")
        assert ready.status_code == 503 and "serving the last good table of 1 pools" in ready.json()["reason"]
        status, backend, lines = _stream_answer(router.url)
        assert (status, backend, lines[-1]) == (200, "fake-1", "[DONE]")

        path.write_bytes(restored)  # the copy ends
        assert wait_for(lambda: httpx.get(f"{router.url}/ready").status_code == 200, 10), reason()
        assert rt.last_refresh_error is None and len(rt.table.pools) == 1
    with open_registry(registry_url, create=False) as reg:
        assert [d.name for d in reg.active_deployments()] == ["fake-1"]
