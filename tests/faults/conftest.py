"""The hardening family: each test reproduces one way the router was broken by hostile input,
lost state, a full or hung disk, or a restart, and shows what it does now. Fixtures are the router's, and
`fake_replica`: a fake engine as the default pool."""

import pytest

from tests.router.conftest import *  # noqa: F401,F403  (registry, error500, serve_router, ...)
from tests.router.fakes import BrokenEngine


@pytest.fixture()
def fake_replica(registry):
    """The default (English) pool: one fake engine that answers streams correctly, slowly enough to see."""
    with BrokenEngine("slow", slow_interval_s=0.01) as fake:
        registry.deploy(None, name="fake-1", url=fake.url, languages=["en"], default=True)
        yield fake


ADMIN_TOKEN = "faults-admin-token"


@pytest.fixture()
def with_token(monkeypatch):
    """POLYSPEC_ADMIN_TOKEN set to `ADMIN_TOKEN` for the test."""
    from polyspec.core.settings import reset_settings_cache

    monkeypatch.setenv("POLYSPEC_ADMIN_TOKEN", ADMIN_TOKEN)
    reset_settings_cache()
    yield ADMIN_TOKEN
    reset_settings_cache()
