"""A registry is created only on purpose (`polyspec registry init`, or a command that writes); readers that
must never make one appear (the router, the dashboard, `polyspec route explain`) open with create=False."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import pytest

from polyspec.registry import RegistryMissing, open_registry


def test_create_false_never_creates_a_registry(tmp_path):
    path = tmp_path / "sub" / "registry.db"
    with pytest.raises(RegistryMissing, match="polyspec registry init"):
        open_registry(f"sqlite:///{path}", create=False)
    assert not path.exists() and not path.parent.exists()
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as con:  # a SQLite database without the registry's tables is no registry
        con.execute("CREATE TABLE notes (text TEXT)")
    with pytest.raises(RegistryMissing, match="holds no polyspec registry"):
        open_registry(f"sqlite:///{other}", create=False)
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()  # an empty file: refused as it is, never initialised
    with pytest.raises(RegistryMissing, match="is empty"):
        open_registry(f"sqlite:///{empty}", create=False)
    assert empty.stat().st_size == 0


def test_a_registry_deleted_under_an_open_reader_is_not_recreated(tmp_path):
    path = tmp_path / "registry.db"
    open_registry(f"sqlite:///{path}").close()
    reader = open_registry(f"sqlite:///{path}", create=False)
    assert reader.active_deployments() == []
    reader.engine.dispose()  # the next read reconnects, as after a dropped connection
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    with pytest.raises(Exception, match="does not exist"):  # a reconnect checks the file first
        reader.active_deployments()
    assert not path.exists()
    reader.close()


def test_registry_init_creates_then_reports(cli, registry_url, tmp_path):
    first = cli("--url", registry_url, "init", "--json")
    assert first.exit_code == 0, first.output
    info = json.loads(first.stdout)
    assert info["revision"] and info["verifiers"] >= 0
    again = cli("--url", registry_url, "init", "--json")  # idempotent: an existing registry is only migrated
    assert again.exit_code == 0 and json.loads(again.stdout)["revision"] == info["revision"]
    assert open_registry(registry_url, create=False).verifiers() is not None
