"""The same registry on a real PostgreSQL server (a throwaway cluster started here; skipped when the
machine has no PostgreSQL binaries or no psycopg driver)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

PG_BIN = Path("/usr/lib/postgresql")


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(PG_BIN.glob(f"*/bin/{name}")) if PG_BIN.is_dir() else []
    return str(versions[-1]) if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; the distribution's postgres account runs the throwaway cluster.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def pg_url():
    pytest.importorskip("psycopg")
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not initdb or not pg_ctl or (os.geteuid() == 0 and not shutil.which("runuser")):
        pytest.skip("PostgreSQL server binaries not available")
    # Not under pytest's tmp dir: that one is private to root and the postgres account cannot enter it.
    root = Path(tempfile.mkdtemp(prefix="polyspec-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    port = _free_port()
    subprocess.run(_as_postgres([initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
                   check=True, capture_output=True)
    subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-w", "-l", str(root / "log"), "-o",
                                 f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "start"]),
                   check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_registry_on_postgres(pg_url: str, verifier, base_draft_dir: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from registry import open_registry
    from registry.schema import Base

    reg = open_registry(pg_url)
    with reg.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    v = reg.add_verifier(verifier)
    base = reg.import_draft(base_draft_dir, verifier=v.name, name="en-base", languages=["en"], status="active")
    reg.add_evaluation(base.ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.2, 0.1, 0.05])
    cand = reg.import_draft(base_draft_dir, verifier=v.name, name="fr-ft", languages=["fr"], parent=base.ref)
    reg.add_evaluation(cand.ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.4, 0.2, 0.1])
    assert reg.promote(cand.ref).passed
    reg.deploy(cand.ref, name="fr-1", url="http://127.0.0.1:8001")
    reg.record_live_stats("r1", [{"language": "fr", "draft_name": cand.ref, "requests": 2, "accepted_per_pos": [1]}])
    reg.record_live_stats("r2", [{"language": "fr", "draft_name": cand.ref, "requests": 1, "accepted_per_pos": [1]}])
    assert [(s.requests, s.accepted_per_pos) for s in reg.live_stats()] == [(3, [2])]
    assert reg.active_deployments()[0].offline_mal == {"fr": pytest.approx(1.7)}
    data = reg.export_json()
    assert set(reg.import_json(data).values()) == {0}
    reg.close()
    assert open_registry(pg_url).get_draft("fr-ft").status == "active"  # reopening does not migrate again
