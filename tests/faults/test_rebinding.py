"""DNS rebinding beyond /admin.

A web page whose name was re-pointed at 127.0.0.1 reaches a loopback router from the browser on its host,
with its own name in Host. /v1/*, /metrics and the probes answered it with 200, so such a page could drive
the completions API. On a loopback listen address, every route now checks Host.
"""

from __future__ import annotations

import httpx
import pytest

from tests.faults.conftest import metric, openai_error, serve_router

CHAT = {"model": "polyspec", "max_tokens": 1, "messages": [{"role": "user", "content": "Hello there, how are you?"}]}
ROUTES = [("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/health"), ("GET", "/ready"),
          ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("OPTIONS", "/v1/chat/completions")]


def _call(url: str, method: str, path: str, host: str) -> httpx.Response:
    body = {"json": CHAT | ({"prompt": "hi"} if path == "/v1/completions" else {})} if method == "POST" else {}
    return httpx.request(method, f"{url}{path}", headers={"Host": host}, timeout=30, **body)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "[::2]"])
def test_every_route_refuses_a_foreign_host_on_loopback(error500, registry_url, host):
    with serve_router(registry_url, fail_threshold=100) as router:
        for method, path in ROUTES:
            error = openai_error(_call(router.url, method, path, host), 400)
            assert error["code"] == "invalid_host" and "POLYSPEC_ROUTER_ALLOWED_HOSTS" in error["message"], path
        assert metric(router.url, "polyspec_rejected_requests_total", reason="host") == len(ROUTES)
    assert error500.completion_requests == 0


def test_loopback_names_and_configured_names_pass(error500, registry_url):
    with serve_router(registry_url, fail_threshold=100, allowed_hosts=["localhost", "router.internal"]) as router:
        port = router.port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", "router.internal", "router.internal:80"):
            assert _call(router.url, "GET", "/v1/models", host).status_code == 200, host
            assert _call(router.url, "POST", "/v1/chat/completions", host).status_code == 502, host  # routed: the engine fails
        # The list replaces the defaults: ::1 was left out, the router's own 127.0.0.1 is always in.
        assert _call(router.url, "GET", "/health", "[::1]").status_code == 400
        assert httpx.get(f"{router.url}/health").status_code == 200  # httpx sends Host: 127.0.0.1:PORT


def test_guard_is_off_on_other_listen_addresses_or_with_a_wildcard(error500, registry_url):
    """Listening on 0.0.0.0, clients reach the router by names the router cannot know (k8s, a LB)."""
    from polyspec.router.app import create_app
    from tests.faults.conftest import ServedApp, router_config

    for overrides in ({"host": "0.0.0.0"}, {"allowed_hosts": ["*"]}):
        app = create_app(router_config(registry_url, **overrides), mount_admin=False)
        with ServedApp(app) as router:
            assert _call(router.url, "GET", "/v1/models", "evil.example").status_code == 200, overrides


def test_admin_keeps_its_own_host_list(registry_url, registry, no_token):
    from polyspec.router.app import create_app
    from tests.faults.conftest import ServedApp, router_config

    config = router_config(registry_url, admin_allowed_hosts=["admin.internal"], allowed_hosts=["api.internal"])
    with ServedApp(create_app(config, mount_admin=True)) as router:
        assert _call(router.url, "GET", "/admin/api/backends", "admin.internal").status_code == 200
        assert _call(router.url, "GET", "/v1/models", "admin.internal").status_code == 400
        assert _call(router.url, "GET", "/admin/api/backends", "api.internal").status_code == 400
        assert _call(router.url, "GET", "/v1/models", "api.internal").status_code == 200
