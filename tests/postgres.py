"""A throwaway PostgreSQL cluster for tests: Debian's server binaries (`make postgres`), started by the test
itself, listening on a Unix socket in a private folder only. The `pg_url` fixture (tests/conftest.py) is shared
by every area that needs a real Postgres (tests/registry/test_postgres.py, tests/scale/).

`make test` installs the server, so a missing one is a failure, never a silent skip; only `make test-fast`
(POLYSPEC_SKIP_INTEGRATION=1) may leave it out, and only when the server is not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


class PostgresMissing(RuntimeError):
    """The server binaries (or runuser, when running as root) are not installed."""


def _run(cmd: list[str]) -> None:
    done = subprocess.run(_as_postgres(cmd), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Start a fresh cluster; yields its SQLAlchemy URL and removes everything on exit (bench scripts use it
    too: bench/registry_writes.py)."""
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not initdb or not pg_ctl:
        raise PostgresMissing(f"PostgreSQL server binaries not found on PATH or under {PG_ROOT}/*/bin: run `make postgres`")
    if os.geteuid() == 0 and not shutil.which("runuser"):
        raise PostgresMissing("running as root needs runuser (util-linux) to start PostgreSQL as the postgres account")
    # Not under pytest's tmp dir: that one is private to root and the postgres account cannot enter it.
    root = Path(tempfile.mkdtemp(prefix="polyspec-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data = root / "data"
    try:
        _run([initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        # A Unix socket in this private folder and no TCP listener: no port to race other tests or a system
        # server for, and nothing reachable from outside the machine.
        _run([pg_ctl, "-D", str(data), "-w", "-t", "60", "-l", str(root / "log"),
              "-o", f"-k {root} -c listen_addresses='' -c fsync=off", "start"])
        yield f"postgresql+psycopg://postgres@/postgres?host={root}"
    finally:
        subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A throwaway cluster per test module (tests/conftest.py makes it visible everywhere)."""
    import psycopg  # noqa: F401  (requirements.lock pins it; a missing driver is a failure, not a skip)

    try:
        cluster = throwaway_postgres()
        url = cluster.__enter__()
    except PostgresMissing as exc:
        if os.environ.get("POLYSPEC_SKIP_INTEGRATION") == "1":
            pytest.skip("POLYSPEC_SKIP_INTEGRATION=1: no PostgreSQL server installed (make postgres)")
        pytest.fail(str(exc))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield url
    finally:
        cluster.__exit__(None, None, None)
