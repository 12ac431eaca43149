"""Registry fixtures: a fresh migrated SQLite registry per test, the bundled verifier registered in it,
and the shared base draft imported (and, where a test needs coverage against it, promoted)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture()
def reg(registry_url: str):
    from polyspec.registry import open_registry

    registry = open_registry(registry_url)
    yield registry
    registry.close()


@pytest.fixture()
def verifier_rec(reg, verifier):
    return reg.add_verifier(verifier)


@pytest.fixture()
def base_draft(reg, verifier_rec, base_draft_dir: Path):
    """The shared English base draft, imported as en-base@1 and active."""
    return reg.import_draft(base_draft_dir, verifier=verifier_rec.name, name="en-base", languages=["en"],
                            status="active", provenance={"data": "english top-8192 vocabulary, untrained"})


@pytest.fixture()
def draft_copy(base_draft_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the base draft that a test may damage."""
    dst = tmp_path / "draft-copy"
    shutil.copytree(base_draft_dir, dst)
    return dst


def write_at_revision(url: str, revision: str, *statements: str) -> None:
    """Take the registry at ``url`` back to migration ``revision`` and run ``statements`` there, as a registry of
    that version would have written rows; the next open_registry upgrades it to head."""
    from alembic import command
    from sqlalchemy import create_engine, text

    from polyspec.registry import db

    engine = create_engine(url)
    with engine.begin() as conn:
        command.downgrade(db.alembic_config(conn), revision)
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))
    engine.dispose()


def snapshot(registry) -> dict[str, Any]:
    """Everything the registry holds, for "nothing was written" assertions."""
    data = registry.export_json()
    data.pop("exported_at")
    return data


@pytest.fixture()
def cli(registry_url: str):
    """Run `polyspec registry ...` in-process through typer's CliRunner (stdout and stderr apart)."""
    from typer.testing import CliRunner

    from polyspec.cli import app

    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(app, ["registry", *args], catch_exceptions=False)

    return run
