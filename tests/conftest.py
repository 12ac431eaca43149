"""Fixtures shared by every test area. Area-specific fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The ../shared/data pack (tests may read it; the product never does)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data pack not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def verifier():
    """The bundled SmolLM2-135M-Instruct verifier, prepared once in POLYSPEC_HOME."""
    from models.verifiers import prepare_verifier

    return prepare_verifier()


@pytest.fixture()
def registry_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite registry for one test, also exported to subprocesses through the environment."""
    from polyspec.settings import reset_settings_cache

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    monkeypatch.setenv("POLYSPEC_REGISTRY_URL", url)
    reset_settings_cache()
    yield url
    reset_settings_cache()


@pytest.fixture(scope="session")
def base_draft_dir(verifier, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (untrained) speculators Eagle3 draft for the bundled verifier, English top-N vocabulary."""
    from models.draft_build import create_draft
    from models.vocab_ref import english_top_token_ids

    out = tmp_path_factory.mktemp("drafts") / "en-base"
    ids = english_top_token_ids(verifier.path, n=8192)
    return create_draft(verifier.path, out, t2d_token_ids=ids, num_layers=1, seed=0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # POLYSPEC_SKIP_INTEGRATION=1 gives a fast inner loop; CI always runs everything.
    if os.environ.get("POLYSPEC_SKIP_INTEGRATION") != "1":
        return
    skip = pytest.mark.skip(reason="POLYSPEC_SKIP_INTEGRATION=1")
    for item in items:
        if "integration" in item.keywords or "browser" in item.keywords:
            item.add_marker(skip)
