"""The admin behind a reverse proxy on the router's host, through a real nginx.

A proxy on the same host makes every client's socket look like 127.0.0.1. A forwarded address is never
trusted as loopback, behind a declared proxy (trusted_proxies) the admin always needs the token, and a
router that would expose its admin without a token (behind a proxy, or listening beyond loopback) does
not start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from polyspec.core.ports import free_port
from tests.faults.conftest import ADMIN_TOKEN as TOKEN
from tests.faults.conftest import ServedApp, openai_error, router_config, wait_for
from tests.faults.proxy import nginx

SUMMARY = "/admin/api/backends"


def _served(registry_url: str, **overrides):
    from polyspec.router.app import create_app

    return ServedApp(create_app(router_config(registry_url, **overrides), mount_admin=True))


def test_a_client_forwarded_by_a_same_host_proxy_is_not_local(registry, registry_url, no_token):
    """Default settings, nginx as usually configured (it appends the client's address): before, the router
    saw a loopback peer and served the admin to anyone who reached nginx."""
    with _served(registry_url) as router, nginx(router.port, "append") as proxy:
        assert httpx.get(f"{router.url}{SUMMARY}", timeout=10).status_code == 200  # a local client, direct
        err = openai_error(httpx.get(f"{proxy}{SUMMARY}", timeout=10), 403)
        assert "came through a proxy (x-forwarded-for)" in err["message"]
        openai_error(httpx.get(f"{proxy}/admin", timeout=10), 403)


@pytest.mark.parametrize("forged", ["::1", "127.0.0.2", "[::1]:5555", "127.0.0.1"])
def test_a_forged_loopback_address_through_a_pass_through_proxy_is_refused(registry, registry_url, no_token,
                                                                            forged):
    with _served(registry_url, trusted_proxies=["127.0.0.1"]) as router, nginx(router.port, "pass") as proxy:
        resp = httpx.get(f"{proxy}{SUMMARY}", headers={"X-Forwarded-For": forged}, timeout=10)
        err = openai_error(resp, 403)
        assert "behind a proxy (trusted_proxies is set) the admin always needs the token" in err["message"]
        # The router's own socket peer is loopback too, and still refused: a proxy is declared.
        openai_error(httpx.get(f"{router.url}{SUMMARY}", timeout=10), 403)


def test_behind_a_declared_proxy_the_token_is_the_way_in(registry, registry_url, with_token):
    with _served(registry_url, trusted_proxies=["127.0.0.1"]) as router, nginx(router.port, "append") as proxy:
        openai_error(httpx.get(f"{proxy}{SUMMARY}", headers={"X-Forwarded-For": "::1"}, timeout=10), 401)
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"{proxy}{SUMMARY}", headers=bearer, timeout=10).status_code == 200


def test_a_proxy_that_hides_its_client_but_passes_the_public_host_is_refused(registry, registry_url, no_token):
    """nginx adding no forwarding header: the client's public Host name reaches the router, and both the
    admin's Host list and the API's (on a loopback router) refuse it."""
    with _served(registry_url) as router, nginx(router.port, "none") as proxy:
        public = {"Host": "router.example.com"}
        assert openai_error(httpx.get(f"{proxy}{SUMMARY}", headers=public, timeout=10), 400)["message"].startswith(
            "invalid Host header for /admin")
        assert openai_error(httpx.get(f"{proxy}/v1/models", headers=public, timeout=10), 400)["code"] == "invalid_host"


def _serve(registry_url: str, *args: str, **env: str) -> subprocess.Popen:
    full = {**os.environ, "POLYSPEC_ADMIN_TOKEN": "", **env}
    return subprocess.Popen([str(Path(sys.executable).parent / "polyspec"), "serve", "--registry", registry_url,
                             "--log-level", "warning", *args], env=full, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("case", ["trusted proxies", "host beyond loopback"])
def test_serve_refuses_an_exposed_admin_without_a_token(registry, registry_url, case):
    port = str(free_port())
    if case == "trusted proxies":
        proc = _serve(registry_url, "--port", port, POLYSPEC_ROUTER_TRUSTED_PROXIES='["127.0.0.1"]')
    else:
        proc = _serve(registry_url, "--port", port, "--host", "0.0.0.0")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "refusing to serve /admin" in err and "export POLYSPEC_ADMIN_TOKEN=" in err and "--no-admin" in err


def test_serve_starts_with_a_token_or_without_the_admin(registry, registry_url):
    """The two ways out the refusal names: behind nginx with a token, and --no-admin beyond loopback."""
    port = free_port()
    proc = _serve(registry_url, "--port", str(port), POLYSPEC_ROUTER_TRUSTED_PROXIES='["127.0.0.1"]',
                  POLYSPEC_ADMIN_TOKEN=TOKEN)

    def up(url: str) -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        assert wait_for(lambda: up(f"http://127.0.0.1:{port}") or proc.poll() is not None, 120, step=0.2)
        with nginx(port, "append") as proxy:
            openai_error(httpx.get(f"{proxy}{SUMMARY}", timeout=10), 401)
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            assert httpx.get(f"{proxy}{SUMMARY}", headers=bearer, timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
    port = free_port()
    proc = _serve(registry_url, "--port", str(port), "--host", "0.0.0.0", "--no-admin")
    try:
        assert wait_for(lambda: up(f"http://127.0.0.1:{port}") or proc.poll() is not None, 120, step=0.2)
        assert proc.poll() is None
        assert httpx.get(f"http://127.0.0.1:{port}/admin", timeout=10).status_code == 404
    finally:
        proc.terminate()
        proc.wait(30)
