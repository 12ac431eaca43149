"""Slow bodies, HEAD/OPTIONS and CORS, per-engine read timeouts, and engine faults blamed on
the engine that failed.

Every test talks HTTP (or a raw socket) to a router served by uvicorn. The engines are the failing fakes of
tests/router/fakes.py: a hang, an HTTP 500 or a cut stream is what is being shown, which a healthy vLLM
does not do on request.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.router.conftest import chat, metric, openai_error, post_head, read_raw_response, serve_router, wait_for
from tests.router.fakes import BrokenEngine

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
FR_TEXT = "Pouvez-vous m'expliquer en deux phrases pourquoi le ciel est bleu pendant la journée ?"
EN_TEXT = "Please explain in two sentences why the sky looks blue during the day."
ORIGIN = "https://chat.example"


def _closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    """A slowloris body: one byte every 0.2 s, never finishing, until the router hangs up."""
    while not stop.is_set():
        try:
            sock.sendall(b" ")
        except OSError:
            return
        time.sleep(0.2)


@pytest.mark.parametrize("how", ["stall-after-10-bytes", "headers-only", "trickle"])
def test_slow_body_gets_408_and_does_not_hold_the_router(error500, registry_url, how):
    """A client that announces 1,000 bytes and sends 10 (or none, or one every 0.2 s) gets an OpenAI-style
    408 once body_timeout_s (1 s here) has passed since its request started, and its connection is closed;
    other clients are served meanwhile. Before, the router waited for the body as long as the client kept
    the connection open."""
    with serve_router(registry_url, body_timeout_s=1.0, fail_threshold=100) as router:
        stop = threading.Event()
        with socket.create_connection(("127.0.0.1", router.port)) as sock:
            started = time.perf_counter()
            sock.sendall(post_head(CHAT, content_length=1000) + (b'{"model": ' if how != "headers-only" else b""))
            if how == "trickle":
                threading.Thread(target=_trickle, args=(sock, stop), daemon=True).start()
            for _ in range(3):  # while the slow body is pending
                t0 = time.perf_counter()
                assert httpx.get(f"{router.url}/health", timeout=5).status_code == 200
                assert time.perf_counter() - t0 < 0.5
            status, headers, body = read_raw_response(sock, timeout=10)
            elapsed = time.perf_counter() - started
            stop.set()
            assert status == 408, body
            assert set(body["error"]) == {"message", "type", "param", "code"}
            assert body["error"]["code"] == "request_timeout" and body["error"]["type"] == "invalid_request_error"
            assert 0.9 < elapsed < 2.5, elapsed
            assert headers.get("connection") == "close"
            assert _closed_by_peer(sock, timeout=5)
        assert metric(router.url, "polyspec_rejected_requests_total", reason="body_timeout") == 1
        openai_error(chat(router.url, EN_TEXT), 502)  # a normal request still reaches the engine
    assert error500.completion_requests == 1


def test_too_large_and_bad_bodies_are_counted_as_rejected(error500, registry_url):
    """413 and 400 answers count in polyspec_rejected_requests; a 413 also closes the connection, since the
    rest of a body that was not read may still be on its way."""
    with serve_router(registry_url, max_body_bytes=2048, fail_threshold=100) as router:
        big = {"model": "polyspec", "messages": [{"role": "user", "content": "x" * 5000}]}
        resp = httpx.post(f"{router.url}{CHAT}", json=big)
        assert openai_error(resp, 413)["code"] == "request_too_large"
        assert resp.headers["connection"] == "close"
        openai_error(httpx.post(f"{router.url}{CHAT}", content=b'{"model": "polyspec", "messages": ['), 400)
        openai_error(httpx.post(f"{router.url}{COMPLETIONS}", json={"model": "polyspec"}), 400)
        assert metric(router.url, "polyspec_rejected_requests_total", reason="too_large") == 1
        assert metric(router.url, "polyspec_rejected_requests_total", reason="bad_request") == 2
        assert metric(router.url, "polyspec_rejected_requests_total", reason="body_timeout") == 0
    assert error500.completion_requests == 0


def test_head_and_options_without_cors(error500, registry_url):
    """HEAD on a GET route answers as GET does, without the body. The completion paths take POST only: any
    other method gets 405 with Allow and an OpenAI-style error. Without cors_allow_origins, OPTIONS (a
    browser's preflight included) gets 405 with Allow, no Access-Control-* header is ever sent, and no CORS
    middleware sits on the hot path."""
    from starlette.middleware.cors import CORSMiddleware

    from polyspec.router.app import ApiCors

    with serve_router(registry_url, fail_threshold=100) as router:
        assert not {m.cls for m in router.app.user_middleware} & {ApiCors, CORSMiddleware}
        with httpx.Client(base_url=router.url, timeout=10) as client:
            for path in ("/health", "/ready", "/v1/models", "/metrics"):
                get, head = client.get(path), client.head(path)
                assert head.status_code == get.status_code == 200, (path, head.status_code)
                assert head.content == b"" and get.content
                assert head.headers["content-type"] == get.headers["content-type"]
                options = client.options(path, headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET"})
                assert openai_error(options, 405)["code"] == "method_not_allowed"
                assert set(options.headers["allow"].split(", ")) == {"GET", "HEAD"}
            for path in (CHAT, COMPLETIONS):
                for method in ("GET", "PUT", "DELETE", "OPTIONS"):
                    err = openai_error(client.request(method, path, headers={"Origin": ORIGIN}), 405)
                    assert err["code"] == "method_not_allowed" and f"{method} is not allowed on {path}" in err["message"]
                head = client.head(path)
                assert head.status_code == 405 and head.headers["allow"] == "POST" and head.content == b""
            resp = client.post(CHAT, json={"model": "polyspec", "messages": [{"role": "user", "content": EN_TEXT}]},
                               headers={"Origin": ORIGIN})
            assert resp.status_code == 502
            assert not any(k.startswith("access-control-") for k in resp.headers)
    assert error500.completion_requests == 1


def test_cors_preflight_and_headers_on_the_api_only(registry, registry_url):
    """With cors_allow_origins set: a browser's preflight of the completion endpoints and /v1/models passes
    for an allowed origin (any request header, as OpenAI's browser SDK sends its own) and fails for another;
    answers, streamed ones included, carry Access-Control-Allow-Origin and expose the routing headers.
    /metrics and the probes stay same-origin."""
    with BrokenEngine("drop") as fake:
        registry.deploy(None, name="droppy", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url, cors_allow_origins=[ORIGIN], fail_threshold=100) as router:
            with httpx.Client(base_url=router.url, timeout=10, headers={"Origin": ORIGIN}) as client:
                for path, method in ((CHAT, "POST"), (COMPLETIONS, "POST"), ("/v1/models", "GET")):
                    asked = "authorization, content-type, x-stainless-os"
                    ok = client.options(path, headers={"Access-Control-Request-Method": method,
                                                       "Access-Control-Request-Headers": asked})
                    assert ok.status_code == 200, (path, ok.text)
                    assert ok.headers["access-control-allow-origin"] == ORIGIN
                    assert method in ok.headers["access-control-allow-methods"]
                    assert ok.headers["access-control-allow-headers"] == asked
                    other = client.options(path, headers={"Origin": "https://evil.example",
                                                          "Access-Control-Request-Method": method})
                    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
                    assert openai_error(other, 400)["code"] == "cors_refused"  # an OpenAI error, not plain text

                body = {"model": "polyspec", "messages": [{"role": "user", "content": EN_TEXT}]}
                with client.stream("POST", CHAT, json={**body, "stream": True}) as streamed:
                    assert streamed.status_code == 200
                    assert streamed.headers["access-control-allow-origin"] == ORIGIN
                    assert "X-Polyspec-Backend" in streamed.headers["access-control-expose-headers"]
                    assert streamed.headers["x-polyspec-backend"] == "droppy"
                    assert b"stream_interrupted" in streamed.read()
                unary = client.post(CHAT, json=body)  # the engine cuts its answer: 502
                assert unary.status_code == 502 and unary.headers["access-control-allow-origin"] == ORIGIN
                models = client.get("/v1/models")
                assert models.status_code == 200 and models.headers["access-control-allow-origin"] == ORIGIN
                for path in ("/metrics", "/health"):
                    resp = client.get(path)
                    assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers
                    assert client.options(path, headers={"Access-Control-Request-Method": "GET"}).status_code == 405
    assert fake.completion_requests == 2


def test_read_timeout_per_engine(registry, registry_url, caplog):
    """engine_read_timeouts_s names an engine by deployment name or by URL; the others keep read_timeout_s.
    Three engines that never answer, asked at once (each through its own model id, so no failover): 504
    after 1 s, 2.5 s and the default 5 s. Before, all three took read_timeout_s. A name that matches no
    engine (a typo) is logged."""
    with (BrokenEngine("hang", model_id="model-a") as a, BrokenEngine("hang", model_id="model-b") as b,
          BrokenEngine("hang", model_id="model-c") as c):
        registry.deploy(None, name="quick", url=a.url, languages=["en"], default=True)
        registry.deploy(None, name="medium", url=b.url, languages=["fr"])
        registry.deploy(None, name="slow", url=c.url, languages=["de"])
        # By name; by URL (a trailing slash is ignored); a typo.
        overrides = {"quick": 1.0, b.url + "/": 2.5, "quik": 9.0}
        with serve_router(registry_url, read_timeout_s=5.0, engine_read_timeouts_s=overrides,
                          fail_threshold=100) as router:

            def timed(model: str, stream: bool) -> tuple[float, dict]:
                started = time.perf_counter()
                resp = chat(router.url, EN_TEXT, model=model, stream=stream, timeout=30)
                return time.perf_counter() - started, openai_error(resp, 504)

            with ThreadPoolExecutor(3) as pool:
                runs = [pool.submit(timed, m, s) for m, s in (("model-a", False), ("model-b", True), ("model-c", False))]
                (quick, qerr), (medium, merr), (slow, serr) = [r.result() for r in runs]
    assert 0.9 < quick < 2.0, quick
    assert 2.4 < medium < 3.8, medium
    assert 4.9 < slow < 8.0, slow
    for err, name in ((qerr, "quick"), (merr, "medium"), (serr, "slow")):
        assert err["code"] == "upstream_timeout" and f"{name}: timeout" in err["message"]
    assert (a.completion_requests, b.completion_requests, c.completion_requests) == (1, 1, 1)
    assert "engine_read_timeouts_s names no engine of the routing table: quik" in caplog.text


def test_a_hung_engine_is_not_blamed_on_the_default_engine(registry, registry_url):
    """The French engine hangs while holding every connection the router allows it (max_connections, 2 here
    so that two requests fill it; 512 by default). The default English engine must stay healthy and answer
    English traffic at once: its own HTTP 500 here, blamed on it and on nothing else.

    Before, the connection limit was shared by all engines: the default engine's health probes and requests
    queued behind the hung engine's connections, timed out, and were counted against it; it was marked down
    and English traffic got 503 while only the French engine was broken."""
    with BrokenEngine("hang") as fr, BrokenEngine("error500") as en:
        registry.deploy(None, name="fr-engine", url=fr.url, languages=["fr"])
        registry.deploy(None, name="en-default", url=en.url, languages=["en"], default=True)
        with serve_router(registry_url, max_connections=2, read_timeout_s=8, health_interval_s=0.3,
                          health_timeout_s=0.5, upstream_keepalive_s=0.2, fail_threshold=2) as router:
            backends = router.runtime.backends
            with ThreadPoolExecutor(2) as pool:
                french = [pool.submit(chat, router.url, FR_TEXT, timeout=30) for _ in range(2)]
                assert wait_for(lambda: backends.in_flight(fr.url) == 2, 10)
                # Several probe rounds of both engines while the French one holds every connection (0.3 s apart:
                # the default engine's idle connection, kept 0.2 s, has expired meanwhile).
                probed = (en.health_probes, fr.health_probes)
                assert wait_for(lambda: en.health_probes >= probed[0] + 4 and fr.health_probes >= probed[1] + 4, 30)
                state = backends.replicas[en.url]
                assert state.healthy and "health" not in (state.last_error or ""), state
                # Nor is the hung engine's /health, which answers, failed for want of a connection: probes
                # never queue behind traffic.
                assert "health" not in (backends.replicas[fr.url].last_error or ""), backends.replicas[fr.url]
                started = time.perf_counter()
                err = openai_error(chat(router.url, EN_TEXT, timeout=30), 502)
                assert time.perf_counter() - started < 2.0
                assert err["message"] == "Every attempt failed (en-default: HTTP 500)."
                assert metric(router.url, "polyspec_upstream_errors_total", backend="en-default", reason="timeout") == 0
                answers = [f.result() for f in french]
            for resp in answers:  # French: its engine timed out, then the default pool answered 500
                err = openai_error(resp, 502)
                assert err["message"].startswith("Every attempt failed (fr-engine: timeout"), err
            assert metric(router.url, "polyspec_upstream_errors_total", backend="fr-engine", reason="timeout") == 2
            assert metric(router.url, "polyspec_upstream_errors_total", backend="en-default", reason="timeout") == 0
            assert metric(router.url, "polyspec_upstream_errors_total", backend="en-default", reason="http_500") == 3
            # Whatever the default engine's state now, only its own answers (HTTP 500) can have set it.
            assert (backends.replicas[en.url].last_error or "http_500").startswith("http_500")
