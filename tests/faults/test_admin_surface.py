"""The /admin surface against hostile clients,
proxies, rebinding pages, cross-site posts, odd paths, and a registry that is gone or hung.

Every request goes through HTTP to the router's real app (create_app over a real SQLite registry): over a
real socket (uvicorn) where the peer address matters as the kernel sees it, through Starlette's TestClient
where the test must choose the peer (a proxy at 10.0.0.5). The registry lock is a real SQLite lock held
by another process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from tests.faults.conftest import ADMIN_TOKEN as TOKEN
from tests.router.conftest import ServedApp, openai_error, router_config, wait_for
from polyspec.core.ports import free_port

DEAD_URL = "http://127.0.0.1:9"  # discard port: refused at once
PROXY = ("10.0.0.5", 41000)  # a reverse proxy's address as the router's socket sees it
LOOPBACK = ("127.0.0.1", 41000)
LOCAL = "http://127.0.0.1:8000"  # TestClient base URL: Host 127.0.0.1:8000, one of the allowed hosts


def make_app(registry_url: str, **overrides: Any) -> Any:
    from polyspec.router.app import create_app

    return create_app(router_config(registry_url, health_interval_s=3600, **overrides))


@contextmanager
def served(registry_url: str, **overrides: Any):
    with ServedApp(make_app(registry_url, **overrides)) as app:
        yield app


@pytest.fixture()
def deployed_dead(registry) -> Any:
    """One default pool whose engine refuses connections: enough for a refresh to succeed (a table with a pool)."""
    registry.deploy(None, name="en-dead", url=DEAD_URL, languages=["en"], default=True)
    return registry


# --- 1. Client address and trust -------------------------------------------------------------------------


def test_loopback_is_trusted_when_no_proxy_is_configured(registry_url, deployed_dead, no_token):
    with served(registry_url) as router:
        assert httpx.get(f"{router.url}/admin/api/summary", timeout=10).status_code == 200


def test_loopback_peer_is_not_trusted_once_a_proxy_is_configured(registry_url, deployed_dead, no_token):
    """A reverse proxy on the router's host makes every client look like 127.0.0.1: with the proxy declared,
    a loopback peer alone is no longer admin, whether or not it sends X-Forwarded-For."""
    for proxies in (["127.0.0.1"], ["10.9.9.9"]):
        with served(registry_url, trusted_proxies=proxies) as router:
            url = f"{router.url}/admin/api/summary"
            bare = httpx.get(url, timeout=10)
            err = openai_error(bare, 403)
            assert "loopback" in err["message"], proxies
            openai_error(httpx.get(url, headers={"X-Forwarded-For": "203.0.113.7"}, timeout=10), 403)
            openai_error(httpx.get(f"{router.url}/admin", timeout=10), 403)


def test_loopback_peer_behind_a_proxy_needs_the_token(registry_url, deployed_dead, with_token):
    with served(registry_url, trusted_proxies=["127.0.0.1"]) as router:
        url = f"{router.url}/admin/api/summary"
        openai_error(httpx.get(url, timeout=10), 401)
        assert httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).status_code == 200


def test_no_forwarded_address_is_trusted_as_loopback(registry_url, deployed_dead, no_token):
    """Without a token: a forwarded client is never local (whatever address it names, loopback ones included),
    and behind a declared proxy nobody is, not even a loopback peer with no forwarding header."""
    path = "/admin/api/summary"

    def status(app: Any, peer: tuple[str, int], headers: list[tuple[str, str]]) -> int:
        with TestClient(app, base_url=LOCAL, client=peer) as c:
            return c.get(path, headers=headers).status_code

    plain = make_app(registry_url)
    assert status(plain, LOOPBACK, []) == 200
    for name, value in (("X-Forwarded-For", "::1"), ("X-Forwarded-For", "127.0.0.1"), ("Forwarded", "for=127.0.0.1"),
                        ("X-Real-IP", "127.0.0.1"), ("Via", "1.1 localhost"), ("X-Forwarded-Host", "localhost")):
        assert status(plain, LOOPBACK, [(name, value)]) == 403, name
    behind = make_app(registry_url, trusted_proxies=["10.0.0.0/24", "2001:db8::/32"])
    for xff in ("::1, 10.0.0.6", "127.0.0.1", "127.0.0.1, 10.0.0.6, 2001:db8::1", "[::1]:5555", "127.0.0.2"):
        assert status(behind, PROXY, [("X-Forwarded-For", xff)]) == 403, xff
    assert status(behind, PROXY, []) == 403
    assert status(behind, LOOPBACK, []) == 403


# --- 2. Host allow-list (DNS rebinding) ------------------------------------------------------------------


def test_admin_answers_only_allowed_host_headers(registry_url, deployed_dead, no_token):
    app = make_app(registry_url, host="10.1.1.1")

    def get(host: str, path: str = "/admin/api/summary", a: Any = app) -> httpx.Response:
        with TestClient(a, base_url=LOCAL, client=LOOPBACK) as c:
            return c.get(path, headers={"Host": host})

    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", "localhost.evil.example", "[::2]:80",
                 "", "127.0.0.1:80:80", "::1"):
        for path in ("/admin", "/admin/api/summary", "/admin/api/backends", "/admin/static/admin.js"):
            err = openai_error(get(host, path), 400)
            assert "host" in err["message"].lower(), (host, path)
    for host in ("localhost", "LOCALHOST:8000", "127.0.0.1", "127.0.0.1:8000", "[::1]", "[::1]:8000",
                 "[0:0::1]:8000", "10.1.1.1:8000", "localhost."):
        assert get(host).status_code == 200, host
    # The rebinding page's own host is refused before any credential is looked at.
    with TestClient(app, base_url=LOCAL, client=LOOPBACK) as c:
        evil = c.post("/admin/api/refresh", headers={"Host": "evil.example", "Content-Type": "application/json"},
                      content=b"{}")
        openai_error(evil, 400)
    with TestClient(app, base_url=LOCAL, client=LOOPBACK) as c:
        assert 'polyspec_rejected_requests_total{reason="admin_host"}' in c.get("/metrics").text
    # An operator's own name, and "*".
    named = make_app(registry_url, admin_allowed_hosts=["admin.example.org"])
    assert get("admin.example.org:443", a=named).status_code == 200
    assert get("localhost", a=named).status_code == 400  # the list replaces the defaults
    anything = make_app(registry_url, admin_allowed_hosts=["*"])
    assert get("evil.example", a=anything).status_code == 200
    # Bound to every interface: 0.0.0.0 is not a name anyone should reach admin by.
    wildcard = make_app(registry_url, host="0.0.0.0")
    assert get("0.0.0.0:8000", a=wildcard).status_code == 400


def test_host_check_over_a_real_socket(registry_url, deployed_dead, no_token):
    with served(registry_url) as router:
        ok = httpx.get(f"{router.url}/admin/api/summary", timeout=10)
        assert ok.status_code == 200
        rebound = httpx.get(f"{router.url}/admin/api/summary", headers={"Host": "attacker.example"}, timeout=10)
        openai_error(rebound, 400)
        assert "registry_error" not in rebound.text  # nothing of the summary leaks


# --- 3. Content type and CSRF on state-changing calls -----------------------------------------------------


def _csrf(c: TestClient) -> str:
    page = c.get("/admin")
    assert page.status_code == 200
    cookie = c.cookies.get("polyspec_csrf")
    assert cookie and f'data-csrf="{cookie}"' in page.text
    set_cookie = page.headers["set-cookie"].lower()
    assert "samesite=strict" in set_cookie and "path=/admin" in set_cookie
    return cookie


def test_refresh_takes_only_json_and_a_csrf_token(registry_url, deployed_dead, no_token):
    app = make_app(registry_url)
    with TestClient(app, base_url=LOCAL, client=LOOPBACK) as c:
        # What a cross-site <form> or a no-cors fetch can send: refused, whatever the credentials.
        err = openai_error(c.post("/admin/api/refresh", content=b"{}", headers={"Content-Type": "text/plain"}), 415)
        assert "application/json" in err["message"]
        openai_error(c.post("/admin/api/refresh", data={"a": "b"}), 415)
        openai_error(c.post("/admin/api/refresh", content=b"x", headers={"Content-Type": "multipart/form-data"}), 415)
        openai_error(c.post("/admin/api/refresh"), 415)  # no body, no type
        # JSON but no CSRF token: refused.
        err = openai_error(c.post("/admin/api/refresh", json={}), 403)
        assert "csrf" in err["message"].lower()
        token = _csrf(c)
        openai_error(c.post("/admin/api/refresh", json={}, headers={"X-CSRF-Token": "wrong"}), 403)
        openai_error(c.post("/admin/api/refresh", json={}, headers={"X-CSRF-Token": ""}), 403)
        ok = c.post("/admin/api/refresh", json={}, headers={"X-CSRF-Token": token})
        assert ok.status_code == 200 and ok.json()["ok"] is True, ok.text
        charset = c.post("/admin/api/refresh", content=b"{}", headers={"X-CSRF-Token": token,
                                                                        "Content-Type": "application/json; charset=utf-8"})
        assert charset.status_code == 200
        # The header without the cookie (a page that guessed or stole the value but cannot send the cookie).
        c.cookies.clear()
        openai_error(c.post("/admin/api/refresh", json={}, headers={"X-CSRF-Token": token}), 403)
        # A page load keeps a valid cookie, so another open tab's token stays good.
        first = _csrf(c)
        assert _csrf(c) == first
        metrics = c.get("/metrics").text
    for reason in ("admin_media_type", "admin_csrf"):
        assert f'polyspec_rejected_requests_total{{reason="{reason}"}}' in metrics, reason


def test_refresh_with_the_admin_token(registry_url, deployed_dead, with_token):
    app = make_app(registry_url)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(app, base_url=LOCAL, client=("10.1.2.3", 40000)) as c:
        # The token in the Authorization header is not something a browser adds by itself: no CSRF token needed.
        assert c.post("/admin/api/refresh", json={}, headers=bearer).status_code == 200
        openai_error(c.post("/admin/api/refresh", content=b"{}", headers={**bearer, "Content-Type": "text/plain"}), 415)
        # The browser's way in: ?token= once, then the cookie. The cookie alone cannot change state.
        assert c.get(f"/admin?token={TOKEN}").status_code == 200
        assert c.get("/admin/api/summary").status_code == 200
        openai_error(c.post("/admin/api/refresh", json={}), 403)
        openai_error(c.post(f"/admin/api/refresh?token={TOKEN}", json={}), 403)
        ok = c.post("/admin/api/refresh", json={}, headers={"X-CSRF-Token": c.cookies.get("polyspec_csrf")})
        assert ok.status_code == 200
        # Without credentials the token rule answers first.
        c.cookies.clear()
        openai_error(c.post("/admin/api/refresh", content=b"{}", headers={"Content-Type": "text/plain"}), 401)


# --- 4. Static paths ---------------------------------------------------------------------------------------


def test_hostile_static_paths_get_404(registry_url, no_token):
    app = make_app(registry_url)
    names = ["%00", "a%00.js", "admin.js%00", "admin.js%00.css", "..%2f..", "..%2F__init__.py", "%2e%2e",
             "%2e%2e%2fauth.py", "x" * 5000, "x" * 300 + ".js", "%ff%fe.js", "%c0%ae%c0%ae",
             "..%5c__init__.py", "%0a.js", "templates%2fdashboard.html", "__init__.py", "admin.js "]
    with TestClient(app, base_url=LOCAL, client=LOOPBACK, raise_server_exceptions=False) as c:
        for name in names:
            resp = c.get(f"/admin/static/{name}")
            assert resp.status_code == 404, (name[:40], resp.status_code)
            assert resp.json()["error"]["code"] == "not_found"
        assert c.get("/admin/static/admin.js").status_code == 200


def test_hostile_static_paths_over_a_real_socket(registry_url, deployed_dead, no_token):
    with served(registry_url) as router:
        for name in ("%00", "a%00.js", "y" * 3000):
            resp = httpx.get(f"{router.url}/admin/static/{name}", timeout=10)
            assert resp.status_code == 404, (name[:20], resp.status_code)
        assert httpx.get(f"{router.url}/health", timeout=10).status_code == 200


# --- 5. The registry: never created, never a global lock ---------------------------------------------------


def test_dashboard_never_creates_a_missing_registry(tmp_path, no_token):
    path = tmp_path / "nowhere" / "registry.db"
    app = make_app(f"sqlite:///{path}")
    # No lifespan: the runtime never starts, so only the dashboard could touch the registry.
    c = TestClient(app, base_url=LOCAL, client=LOOPBACK)
    for _ in range(2):
        resp = c.get("/admin/api/summary")
        assert resp.status_code == 200
        body = resp.json()
        assert body["router_id"] == "test-router" and "does not exist" in body["registry_error"]
    assert c.get("/admin").status_code == 200
    assert not path.exists() and not path.parent.exists()


def test_dashboard_never_recreates_a_deleted_registry(registry, registry_url, no_token):
    path = Path(registry_url.removeprefix("sqlite:///"))
    registry.close()
    c = TestClient(make_app(registry_url), base_url=LOCAL, client=LOOPBACK)
    assert c.get("/admin/api/summary").json()["registry_error"] is None
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    for _ in range(3):
        resp = c.get("/admin/api/summary")
        # Said so, not shown from the connection still open on the deleted file, and never re-created.
        assert resp.status_code == 200 and "does not exist" in (resp.json()["registry_error"] or "")
    assert not path.exists()


LOCKER = r"""
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
# Exclusive locking mode: even WAL readers wait (a registry held by a stuck writer or a backup tool).
con.execute("PRAGMA locking_mode=EXCLUSIVE")
con.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
con.execute("ROLLBACK")
"""


@contextmanager
def sqlite_locked(path: Path):
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        yield
    finally:
        locker.stdin.close()
        locker.wait(10)


class DashboardOnly(ServedApp):
    """The router app on a real socket without its lifespan: the runtime never starts, so the dashboard is the
    only reader of the registry (an exclusive SQLite lock needs every other connection closed)."""

    def __init__(self, app: Any) -> None:
        super().__init__(app)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)


def _registry_threads() -> int:
    return sum(t.name.startswith("polyspec-admin-registry") for t in threading.enumerate())


def _timed_get(url: str) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    resp = httpx.get(url, timeout=15)
    return resp, time.monotonic() - t0


def test_locked_sqlite_registry_does_not_block_the_admin(registry, registry_url, tmp_path, fake_verifier, no_token):
    """The registry file is exclusively locked by another process: every open of it waits out SQLite's 30 s
    busy timeout. The summary answers within its 2 s bound with the telemetry and the reason; concurrent
    polls share one registry read; another router in the same process (another registry) is not held up
    by a process-wide lock; the page and /health answer at once."""
    from polyspec.registry import open_registry

    path = Path(registry_url.removeprefix("sqlite:///"))
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    with open_registry(other_url) as other:
        other.add_verifier(fake_verifier)
    registry.close()
    hung_app, other_app = make_app(registry_url), make_app(other_url, router_id="other-router")
    with DashboardOnly(hung_app) as hung, DashboardOnly(other_app) as healthy:
        assert _timed_get(f"{healthy.url}/admin/api/summary")[0].json()["registry_error"] is None
        with sqlite_locked(path):
            resp, took = _timed_get(f"{hung.url}/admin/api/summary")
            assert resp.status_code == 200 and took < 4.0, took
            body = resp.json()
            assert body["router_id"] == "test-router" and body["langid"]["total"] == 0  # telemetry still there
            assert body["registry_error"] == "registry did not answer within 2 s"
            # Ten polls at once while it hangs: all answer within the bound, one thread waits on the registry.
            with ThreadPoolExecutor(10) as pool:
                polls = list(pool.map(lambda _: _timed_get(f"{hung.url}/admin/api/summary"), range(10)))
            assert all(r.status_code == 200 and "did not answer" in r.json()["registry_error"] for r, _ in polls)
            assert max(t for _, t in polls) < 4.0, [round(t, 2) for _, t in polls]
            assert _registry_threads() == 1
            # No global lock: the other router's dashboard reads its own registry at once.
            resp, took = _timed_get(f"{healthy.url}/admin/api/summary")
            assert resp.status_code == 200 and resp.json()["registry_error"] is None and took < 1.5, took
            for fast in ("/admin/api/backends", "/admin", "/health"):
                resp, took = _timed_get(f"{hung.url}{fast}")
                assert resp.status_code == 200 and took < 1.0, (fast, took)
        # The lock released: the waiting read finishes, and the page shows the registry again.
        assert wait_for(lambda: _timed_get(f"{hung.url}/admin/api/summary")[0].json()["registry_error"] is None,
                        15, step=0.3)
        assert wait_for(lambda: _registry_threads() == 0, 15)
    assert path.exists()


@pytest.fixture(scope="module")
def pg_registry(pg_url: str, fake_verifier: Any) -> str:  # pg_url: tests/postgres.py, through tests/conftest.py
    from polyspec.registry import open_registry

    with open_registry(pg_url) as reg:
        reg.add_verifier(fake_verifier)
        reg.deploy(None, name="pg-dead", url=DEAD_URL, languages=["en"], default=True)
    return pg_url


@contextmanager
def pg_locked(url: str, tables: list[str]):
    """Another session holds ACCESS EXCLUSIVE locks: every read of these tables waits (Postgres has no
    default lock timeout), as behind a stuck migration or a long maintenance job."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()


def test_hung_postgres_registry_does_not_block_the_admin(pg_registry, no_token):
    """A whole router (runtime started) on Postgres whose tables another session holds locked: the summary
    and the refresh button answer within their bounds, and recover once the lock goes."""
    from polyspec.router import admin
    from polyspec.router.app import create_app

    app = create_app(router_config(pg_registry, health_interval_s=3600), mount_admin=False)
    admin.mount(app, app.state.runtime, refresh_timeout_s=1.0)
    with ServedApp(app) as router, httpx.Client(base_url=router.url, timeout=15) as c:
        assert c.get("/admin").status_code == 200
        csrf = {"X-CSRF-Token": c.cookies.get("polyspec_csrf")}
        assert c.get("/admin/api/summary").json()["registry_error"] is None
        with pg_locked(pg_registry, ["alembic_version", "drafts", "deployments"]):
            t0 = time.monotonic()
            summary = c.get("/admin/api/summary")
            assert summary.status_code == 200 and time.monotonic() - t0 < 4.0
            assert summary.json()["registry_error"] == "registry did not answer within 2 s"
            assert [b["name"] for b in summary.json()["backends"]] == ["pg-dead"]
            for _ in range(3):  # repeated clicks do not queue refreshes up behind the hung one
                t0 = time.monotonic()
                err = openai_error(c.post("/admin/api/refresh", json={}, headers=csrf), 503)
                assert "did not answer within 1 s" in err["message"] and time.monotonic() - t0 < 3.0
            assert c.get("/health").status_code == 200
        assert wait_for(lambda: c.get("/admin/api/summary").json()["registry_error"] is None, 15, step=0.3)
        assert wait_for(lambda: c.post("/admin/api/refresh", json={}, headers=csrf).status_code == 200, 15, step=0.3)


def test_polyspec_serve_leaves_forwarded_for_to_the_router(registry, registry_url, no_token):
    """uvicorn's own X-Forwarded-For handling (on by default, trusting 127.0.0.1) rewrites the peer before
    the router sees it. `polyspec serve` leaves X-Forwarded-For to the router, which never takes a forwarded
    client for a local one: a local process sending "::1" is refused, one sending nothing is served."""
    port = free_port()
    env = {**os.environ, "POLYSPEC_ADMIN_TOKEN": ""}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "polyspec"), "serve", "--port", str(port),
                             "--registry", registry_url, "--log-level", "warning"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_for(up, 60, step=0.2)
        forged = httpx.get(f"{base}/admin/api/backends", headers={"X-Forwarded-For": "::1"}, timeout=10)
        assert forged.status_code == 403
        assert httpx.get(f"{base}/admin/api/backends", timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
