"""Admin API: access rules, and the figures the dashboard draws, on a real router app and registry.

Telemetry is fed through the router's own recording functions (``runtime.telemetry``), as a request
through an engine would; the thing under test here is the dashboard, not the engines.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from polyspec.router.admin.auth import COOKIE_NAME
from tests.router.conftest import admin_post

REPO = Path(__file__).resolve().parents[2]
MTBENCH = REPO / "training" / "data" / "mtbench"
LOOPBACK = ("127.0.0.1", 50123)
BASE = "http://127.0.0.1:8000"  # TestClient's Host: one the admin answers (its default "testserver" is not)
DEAD_URL = "http://127.0.0.1:9"  # discard port: nothing listens, connections are refused at once

# Offline evaluations written to the registry (acceptance = P(>= i accepted), MAL = 1 + sum).
EN_OFFLINE = [0.6, 0.4, 0.2]  # MAL 2.2
FR_OFFLINE = [0.5, 0.3, 0.1]  # MAL 1.9


def populate_registry(url: str, draft_dir: Path, *, en_url: str, fr_url: str) -> None:
    """Two real drafts (en, fr) with offline evaluations, deployed; language profiles en, fr, ru."""
    from polyspec.registry import open_registry

    reg = open_registry(url)
    try:
        verifier = reg.ensure_verifier().name
        reg.import_draft(draft_dir, verifier=verifier, name="en-chat", languages=["en"], status="active")
        reg.import_draft(draft_dir, verifier=verifier, name="fr-chat", languages=["fr"], status="active")
        reg.import_draft(draft_dir, verifier=verifier, name="fr-chat", languages=["fr"], status="candidate")
        reg.add_evaluation("en-chat@1", benchmark="mtbench", language="en", k=3, acceptance=EN_OFFLINE)
        reg.add_evaluation("fr-chat@1", benchmark="mtbench", language="fr", k=3, acceptance=FR_OFFLINE)
        reg.add_evaluation("en-chat@1", benchmark="mtbench", language="fr", k=3, acceptance=[0.4, 0.2, 0.1])
        # A low coverage threshold so the Latin languages get the fine-tune plan; Russian (Cyrillic)
        # is flagged for from-scratch training whatever its coverage.
        for code in ("en", "fr", "ru"):
            reg.add_language(code, MTBENCH / f"{code}.jsonl", verifier, threshold=0.3)
        reg.deploy("en-chat@1", name="en-general", url=en_url, default=True)
        reg.deploy("fr-chat@1", name="fr-general", url=fr_url)
    finally:
        reg.close()


def feed_telemetry(runtime) -> None:
    """10 requests: 6 en, 3 fr, 1 de (low confidence, default pool) with known acceptance histograms."""
    t = runtime.telemetry
    for conf in (0.99, 0.98, 0.97, 0.93, 0.91, 0.55):
        t.observe_decision("en", "general", conf, "langid")
    for conf in (0.96, 0.88, 0.42):
        t.observe_decision("fr", "general", conf, "langid")
    t.observe_decision("de", "general", 0.31, "langid")
    # histogram[j] = verify steps accepting exactly j drafts (vLLM's per-request summary).
    # Engine wall times: en 70 tokens in 3.5 s (20 tokens/s), fr 25 tokens in 2.5 s (10 tokens/s).
    t.observe_acceptance(("en", "general", "en-chat@1"), {"acceptance_histogram": [2, 3, 3, 2]}, 40, 2.0)
    t.observe_acceptance(("en", "general", "en-chat@1"), {"acceptance_histogram": [3, 2, 3, 2]}, 30, 1.5)
    t.observe_acceptance(("fr", "general", "fr-chat@1"), {"acceptance_histogram": [5, 3, 1, 1]}, 25, 2.5)
    t.observe_acceptance(("de", "general", "en-chat@1"), None, 12)
    # The speed policy's predictions for the pools that answered (the latest one per language and draft wins).
    t.observe_prediction("en", "en-chat@1", 30.0)
    t.observe_prediction("en", "en-chat@1", 24.5)
    t.observe_prediction("fr", "fr-chat@1", 12.25)


# en: 20 steps; >=1: 15, >=2: 10, >=3: 4 -> acceptance [0.75, 0.5, 0.2], MAL 2.45
EN_LIVE = [0.75, 0.5, 0.2]
# fr: 10 steps; >=1: 5, >=2: 2, >=3: 1 -> [0.5, 0.2, 0.1], MAL 1.8
FR_LIVE = [0.5, 0.2, 0.1]


@pytest.fixture(scope="module")
def admin_registry(verifier, base_draft_dir, tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('admin') / 'registry.db'}"
    populate_registry(url, base_draft_dir, en_url=DEAD_URL, fr_url="http://127.0.0.1:10")
    return url


def make_app(registry_url: str, **overrides):
    from polyspec.router.app import create_app
    from polyspec.router.config import RouterConfig

    config = RouterConfig(registry_url=registry_url, router_id="test-router", fail_threshold=1, language_threshold=0.5,
                          health_interval_s=3600, refresh_interval_s=3600, flush_interval_s=3600, **overrides)
    return create_app(config)


@pytest.fixture()
def with_token(monkeypatch):
    from polyspec.core.settings import reset_settings_cache

    monkeypatch.setenv("POLYSPEC_ADMIN_TOKEN", "s3cret-token")
    reset_settings_cache()
    yield "s3cret-token"
    reset_settings_cache()


def test_without_token_only_loopback_clients_are_served(admin_registry, no_token):
    app = make_app(admin_registry)
    with TestClient(app, base_url=BASE, client=("10.1.2.3", 40000)) as remote:
        for path in ("/admin", "/admin/api/summary"):
            resp = remote.get(path)
            assert resp.status_code == 403, path
            assert "loopback" in resp.text
        assert remote.post("/admin/api/refresh").status_code == 403
    with TestClient(app, base_url=BASE, client=LOOPBACK) as local:
        assert local.get("/admin").status_code == 200
        assert local.get("/admin/api/summary").status_code == 200
    with TestClient(app, base_url=BASE, client=("::1", 40000)) as local6:
        assert local6.get("/admin/api/summary").status_code == 200


def test_token_is_required_when_configured(admin_registry, with_token):
    app = make_app(admin_registry)
    # With a token configured even loopback clients must present it.
    with TestClient(app, base_url=BASE, client=LOOPBACK) as c:
        missing = c.get("/admin/api/summary")
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"]["message"] == "admin token required"
        assert c.get("/admin/api/summary", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = c.get("/admin/api/summary", headers={"Authorization": f"Bearer {with_token}"})
        assert ok.status_code == 200 and ok.json()["router_id"] == "test-router"
    with TestClient(app, base_url=BASE, client=("10.1.2.3", 40000)) as browser:
        assert browser.get("/admin?token=wrong").status_code == 401
        page = browser.get(f"/admin?token={with_token}")
        assert page.status_code == 200
        assert browser.cookies.get(COOKIE_NAME) == with_token
        # The page's own fetches then carry the cookie, no header needed.
        assert browser.get("/admin/api/summary").status_code == 200
        assert admin_post(browser, "/admin/api/refresh").status_code == 200


def test_summary_reports_live_against_offline(admin_registry, no_token):
    app = make_app(admin_registry)
    with TestClient(app, base_url=BASE, client=LOOPBACK) as c:
        feed_telemetry(app.state.runtime)
        s = c.get("/admin/api/summary").json()
    assert s["registry_error"] is None
    assert s["totals"]["requests"] == 10 and s["totals"]["languages"] == 3
    langs = {row["code"]: row for row in s["languages"]}
    assert [row["code"] for row in s["languages"]] == ["en", "fr", "de"]  # by traffic
    assert langs["en"]["share"] == pytest.approx(0.6) and langs["fr"]["share"] == pytest.approx(0.3)
    assert langs["en"]["acceptance"] == pytest.approx(EN_LIVE)
    assert langs["en"]["mean_acceptance_length"] == pytest.approx(2.45)
    assert langs["en"]["offline_mean_acceptance_length"] == pytest.approx(2.2)
    assert langs["fr"]["acceptance"] == pytest.approx(FR_LIVE)
    assert langs["fr"]["offline_mean_acceptance_length"] == pytest.approx(1.9)  # fr-chat's, not en-chat's 1.7
    assert langs["de"]["acceptance"] is None  # no speculative steps recorded
    live = {(row["language"], row["draft"]): row for row in s["live"]}
    assert live[("en", "en-chat@1")]["observed_tps"] == pytest.approx(20.0)  # 70 tokens over 3.5 s at the engine
    assert live[("fr", "fr-chat@1")]["observed_tps"] == pytest.approx(10.0)
    assert live[("de", "en-chat@1")]["observed_tps"] is None  # no engine time recorded
    # Predicted next to observed, per language and draft (the dashboard's live table shows both).
    assert live[("en", "en-chat@1")]["predicted_tps"] == pytest.approx(24.5)
    assert live[("fr", "fr-chat@1")]["predicted_tps"] == pytest.approx(12.25)
    assert live[("de", "en-chat@1")]["predicted_tps"] is None  # no prediction for German on that draft
    # fastText confidence histogram: 10 decisions, three of them at or below the 0.5 threshold.
    assert s["langid"]["total"] == 10 and s["langid"]["threshold"] == 0.5
    edges, counts = s["langid"]["edges"], s["langid"]["counts"]
    assert sum(c for c, hi in zip(counts, edges[1:]) if hi <= 0.5) == 2
    assert counts[-2:] == [2, 4] and sum(counts) == 10  # (0.9, 0.95]: 0.93, 0.91; (0.95, 1]: four


def test_summary_lists_drafts_profiles_and_backends(admin_registry, no_token):
    app = make_app(admin_registry)
    with TestClient(app, base_url=BASE, client=LOOPBACK) as c:
        s = c.get("/admin/api/summary").json()
    drafts = {row["language"]: row for row in s["drafts"]}
    assert drafts["ru"]["from_scratch"] is True and drafts["ru"]["plan"] == "from-scratch-custom-vocab"
    assert drafts["ru"]["script"] == "Cyrillic" and drafts["ru"]["drafts"] == []
    assert drafts["en"]["from_scratch"] is False and drafts["en"]["plan"] == "finetune"
    assert drafts["fr"]["from_scratch"] is False
    fr = drafts["fr"]["drafts"]
    assert [(d["name"], d["version"], d["status"]) for d in fr] == [("fr-chat", 1, "active"), ("fr-chat", 2, "candidate")]
    assert fr[0]["offline_mean_acceptance_length"] == pytest.approx(1.9)
    assert fr[1]["offline_mean_acceptance_length"] is None  # v2 was never evaluated
    backends = {b["name"]: b for b in s["backends"]}
    assert set(backends) == {"en-general", "fr-general"}
    assert backends["en-general"]["languages"] == ["en"] and backends["en-general"]["is_default"] is True
    assert backends["en-general"]["healthy"] is False  # nothing listens there (fail_threshold=1)
    assert s["totals"]["backends"] == 2 and s["totals"]["healthy_backends"] == 0


def test_refresh_reloads_the_routing_table(admin_registry, base_draft_dir, no_token, tmp_path):
    from polyspec.registry import open_registry

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    populate_registry(url, base_draft_dir, en_url=DEAD_URL, fr_url="http://127.0.0.1:10")
    app = make_app(url)
    with TestClient(app, base_url=BASE, client=LOOPBACK) as c:
        assert len(c.get("/admin/api/backends").json()) == 2
        with open_registry(url) as reg:
            reg.deploy("en-chat@1", name="en-replica", url="http://127.0.0.1:11")
        assert len(c.get("/admin/api/backends").json()) == 2  # not yet: refresh interval is an hour
        resp = admin_post(c, "/admin/api/refresh")
        assert resp.status_code == 200 and resp.json()["ok"] is True
        names = {b["name"] for b in c.get("/admin/api/backends").json()}
    assert names == {"en-general", "fr-general", "en-replica"}


def test_dashboard_assets_are_local(admin_registry, no_token):
    app = make_app(admin_registry)
    with TestClient(app, base_url=BASE, client=LOOPBACK) as c:
        html = c.get("/admin").text
        assets = [c.get(f"/admin/static/{name}") for name in ("admin.js", "charts.js", "admin.css")]
        assert c.get("/admin/static/..%2F__init__.py").status_code == 404
    assert all(a.status_code == 200 for a in assets)
    for text in [html] + [a.text for a in assets]:
        # The only absolute URL allowed is the SVG namespace: no CDN, no fonts, nothing fetched remotely.
        stripped = text.replace("http://www.w3.org/2000/svg", "")
        assert "http://" not in stripped and "https://" not in stripped and "//cdn" not in stripped
