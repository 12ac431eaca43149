"""The hardening family (issue 13): each test reproduces one way the router was broken by hostile input,
lost state, a full or hung disk, or a restart, and shows what it does now. Fixtures are the router's."""

from tests.router.conftest import *  # noqa: F401,F403  (registry, error500, serve_router, ...)
