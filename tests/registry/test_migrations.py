"""Alembic migrations build exactly the declared schema, from any working directory, and SQLite runs in WAL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, text


def test_upgrade_head_on_empty_db_matches_schema(tmp_path: Path, monkeypatch) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from polyspec.registry import db, open_registry
    from polyspec.registry.schema import Base

    monkeypatch.chdir(tmp_path)  # migrations must not depend on the current directory
    url = f"sqlite:///{tmp_path / 'sub' / 'fresh.db'}"
    open_registry(url).close()
    engine = create_engine(url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        assert db.current_revision(conn) == db.head_revision()
        tables = set(conn.execute(text("SELECT name FROM sqlite_master WHERE type='table'")).scalars())
    assert {"verifiers", "drafts", "evaluations", "deployments", "language_profiles", "live_stats"} <= tables
    open_registry(url).close()  # a second open is a no-op, not a second migration


def test_sqlite_pragmas(reg) -> None:
    with reg.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000


def test_import_is_torch_free() -> None:
    code = "import registry, registry.cli, registry.store; import sys; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_bad_url_is_a_clear_error() -> None:
    import pytest

    from polyspec.registry import RegistryError, open_registry

    with pytest.raises(RegistryError, match="invalid registry URL"):
        open_registry("not a url")
