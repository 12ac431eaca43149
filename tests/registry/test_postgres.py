"""The same registry on a real PostgreSQL server: a throwaway cluster that this module starts itself.

`make test` installs Debian's postgresql (`make postgres`), so a missing server is a failure here, never a
silent skip. Only `make test-fast` (POLYSPEC_SKIP_INTEGRATION=1) may leave it out, and only when the server
is not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_ROOT = Path("/usr/lib/postgresql")


def _bin(name: str) -> str | None:
    """Debian keeps the server binaries off PATH, under /usr/lib/postgresql/<major>/bin: the newest wins."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(PG_ROOT.glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    return str(versions[-1]) if versions else None


def _as_postgres(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root (CI runs as root); the distribution's postgres account runs it.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _run(cmd: list[str]) -> None:
    done = subprocess.run(_as_postgres(cmd), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not initdb or not pg_ctl:
        if os.environ.get("POLYSPEC_SKIP_INTEGRATION") == "1":
            pytest.skip("POLYSPEC_SKIP_INTEGRATION=1: no PostgreSQL server installed (make postgres)")
        pytest.fail(f"PostgreSQL server binaries not found on PATH or under {PG_ROOT}/*/bin: run `make postgres`")
    if os.geteuid() == 0 and not shutil.which("runuser"):
        pytest.fail("running as root needs runuser (util-linux) to start PostgreSQL as the postgres account")
    import psycopg  # noqa: F401  (requirements.lock pins it; a missing driver is a failure, not a skip)

    # Not under pytest's tmp dir: that one is private to root and the postgres account cannot enter it.
    root = Path(tempfile.mkdtemp(prefix="polyspec-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data = root / "data"
    # A Unix socket in this private folder and no TCP listener: no port to race other tests or a system
    # server for, and nothing reachable from outside the machine.
    _run([initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
    _run([pg_ctl, "-D", str(data), "-w", "-t", "60", "-l", str(root / "log"),
          "-o", f"-k {root} -c listen_addresses='' -c fsync=off", "start"])
    try:
        yield f"postgresql+psycopg://postgres@/postgres?host={root}"
    finally:
        subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_registry_on_postgres(pg_url: str, verifier, base_draft_dir: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from polyspec.registry import open_registry
    from polyspec.registry.schema import Base

    reg = open_registry(pg_url)
    assert reg.engine.dialect.name == "postgresql"  # the URL really reached the server, not a fallback
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
    again = open_registry(pg_url)  # reopening does not migrate again
    assert again.get_draft("fr-ft").status == "active"
    again.close()
