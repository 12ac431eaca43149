"""Fixtures for tests/models."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture()
def tmp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty POLYSPEC_HOME for one test."""
    from polyspec.core.settings import reset_settings_cache

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("POLYSPEC_HOME", str(home))
    reset_settings_cache()
    yield home
    reset_settings_cache()


@pytest.fixture()
def prepared_copy(verifier, tmp_home: Path) -> Path:
    """The prepared verifier copied into tmp_home; the big weights file is hard-linked, never written to."""
    target = tmp_home / "models" / verifier.path.name
    target.mkdir(parents=True)
    for f in verifier.path.iterdir():
        if f.name == "model.safetensors":
            os.link(f, target / f.name)
        else:
            shutil.copy2(f, target / f.name)
    return target
