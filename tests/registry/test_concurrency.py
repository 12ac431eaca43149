"""Two processes writing to one SQLite registry at the same moment: every write lands, nothing is corrupt."""

from __future__ import annotations

import multiprocessing as mp

from sqlalchemy import create_engine, text

ROUNDS = 25


def _writer(url: str, worker: int, start) -> None:  # noqa: ANN001 - mp.Event
    from polyspec.registry import open_registry

    reg = open_registry(url)
    start.wait(30)
    for i in range(ROUNDS):
        # Same key from both processes: a read-modify-write that loses updates unless writes serialise.
        reg.record_live_stats("shared", [{"language": "fr", "domain": "general", "draft_name": "d", "requests": 1,
                                          "num_spec_steps": 2, "num_accepted_tokens": 1, "accepted_per_pos": [1, 0]}])
        reg.record_live_stats(f"r{worker}", [{"language": "en", "draft_name": "none", "requests": 1}])
        if i % 5 == 0:
            reg.deploy(None, name=f"w{worker}-{i}", url=f"http://127.0.0.1:{9000 + worker}", languages=["en"])
    reg.close()


def test_two_processes_write_at_once(reg, verifier_rec, registry_url: str) -> None:
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(registry_url, w, start)) for w in (1, 2)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0
    shared = reg.live_stats(router_id="shared")
    assert [(s.requests, s.num_spec_steps, s.accepted_per_pos) for s in shared] == [(2 * ROUNDS, 4 * ROUNDS, [2 * ROUNDS, 0])]
    total = {(s.language, s.draft_name): s.requests for s in reg.live_stats()}
    assert total == {("en", "none"): 2 * ROUNDS, ("fr", "d"): 2 * ROUNDS}
    assert len(reg.deployments()) == 2 * len(range(0, ROUNDS, 5))
    with create_engine(registry_url).connect() as conn:
        assert conn.execute(text("PRAGMA integrity_check")).scalar() == "ok"


def test_a_reader_keeps_its_wal_while_another_process_closes(reg, registry_url: str, tmp_path) -> None:
    """A router's registry (create=False) with a connection held by one thread and another made by a second: a
    second process that opens and closes the registry must not take it for the last user and delete the WAL
    under it (the router then saw disk I/O errors and a malformed database). Reading the file's header through
    a descriptor of our own, closed again, dropped the router's SQLite locks."""
    import subprocess
    import sys
    import threading

    from polyspec.registry import open_registry

    path = tmp_path / "registry.db"
    router = open_registry(registry_url, create=False)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with router.engine.connect():
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(30)
        router.record_live_stats("r1", [{"language": "it", "draft_name": "d", "requests": 1}])  # a second connection
        code = (f"from polyspec.registry import open_registry; r = open_registry({registry_url!r}); r.live_stats(); "
                "r.close()")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
        assert (tmp_path / "registry.db-wal").exists() and (tmp_path / "registry.db-shm").exists()
        router.record_live_stats("r1", [{"language": "it", "draft_name": "d", "requests": 1}])
        assert [s.requests for s in router.live_stats(router_id="r1")] == [2]
    finally:
        release.set()
        thread.join(30)
        router.close()
    assert path.is_file()
