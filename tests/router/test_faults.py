"""Faults and bad requests: every failure comes back as an OpenAI-style error with the right status.

The broken backends are the fake server of tests/router/fakes.py (the only place a fake is allowed).
Failover to a healthy engine is covered with real vLLM engines in test_integration.py.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.router.conftest import chat, serve_router
from tests.router.fakes import MODEL_ID, BrokenEngine, free_port


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


@pytest.fixture()
def error500(registry):
    with BrokenEngine("error500") as fake:
        registry.deploy(None, name="broken", url=fake.url, languages=["en"], default=True)
        yield fake


def test_every_replica_down_gives_503(registry, registry_url):
    registry.deploy(None, name="dead-1", url=f"http://127.0.0.1:{free_port()}", languages=["en"], default=True)
    registry.deploy(None, name="dead-2", url=f"http://127.0.0.1:{free_port()}", languages=["fr"])
    with serve_router(registry_url) as router:
        assert httpx.get(f"{router.url}/ready").status_code == 503
        err = _error(chat(router.url, "Hello, how are you?"), 503)
        assert err["type"] == "service_unavailable"
        assert httpx.get(f"{router.url}/health").status_code == 200


def test_500_from_every_attempt_gives_502(error500, registry_url):
    with serve_router(registry_url, fail_threshold=5) as router:
        err = _error(chat(router.url, "Hello, how are you?", model=MODEL_ID), 502)
        assert "HTTP 500" in err["message"]
        assert error500.completion_requests == 1  # one replica: one attempt
        metrics = httpx.get(f"{router.url}/metrics").text
        assert 'polyspec_upstream_errors_total{backend="broken",reason="http_500"} 1.0' in metrics


def test_crash_before_first_byte_with_no_alternative_gives_502(registry, registry_url):
    with BrokenEngine("crash") as fake:
        registry.deploy(None, name="crashy", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url) as router:
            _error(chat(router.url, "Hello there", stream=True), 502)
            assert fake.completion_requests == 1


def test_hang_times_out_with_504(registry, registry_url):
    with BrokenEngine("hang") as fake:
        registry.deploy(None, name="hangs", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url, read_timeout_s=1.0, fail_threshold=5) as router:
            err = _error(chat(router.url, "Hello there"), 504)
            assert err["code"] == "upstream_timeout"
            assert _error(chat(router.url, "Hello again", stream=True), 504)["code"] == "upstream_timeout"
            assert fake.completion_requests == 2


def test_drop_mid_stream_ends_with_clean_sse_error(registry, registry_url):
    with BrokenEngine("drop") as fake:
        registry.deploy(None, name="droppy", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url) as router:
            body = {"model": "polyspec", "stream": True, "messages": [{"role": "user", "content": "Hello there"}]}
            with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=30) as resp:
                assert resp.status_code == 200
                assert resp.headers["x-polyspec-backend"] == "droppy"
                raw = resp.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    content = [json.loads(e[6:]) for e in events[:2]]
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == "Hello"
    error = json.loads(events[2][6:])["error"]
    assert error["code"] == "stream_interrupted" and error["type"] == "upstream_error"
    assert events[3] == "data: [DONE]" and len(events) == 4


@pytest.mark.parametrize(
    ("content", "headers", "status", "param"),
    [
        (b'{"model": "polyspec", "messages": [', {}, 400, None),
        (b'{"model": "polyspec", "messages": [{"role": "user", "content": "caf\xe9"}]}', {}, 400, None),
        (b'{"model": "polyspec"}', {}, 400, "messages"),
        (b'{"model": "polyspec", "messages": []}', {}, 400, "messages"),
        (b'["not", "an", "object"]', {}, 400, None),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', {}, 400, "model"),
        (b'{"model": "gpt-17", "messages": [{"role": "user", "content": "hi"}]}', {}, 404, "model"),
    ],
    ids=["bad-json", "invalid-utf8", "missing-messages", "empty-messages", "not-object", "missing-model",
         "unknown-model"],
)
def test_bad_chat_requests(error500, registry_url, content, headers, status, param):
    with serve_router(registry_url) as router:
        resp = httpx.post(f"{router.url}/v1/chat/completions", content=content,
                          headers={"content-type": "application/json", **headers})
        assert _error(resp, status)["param"] == param
        assert error500.completion_requests == 0  # nothing bad reached an engine


def test_oversized_body_413_and_missing_prompt_400(error500, registry_url):
    with serve_router(registry_url, max_body_bytes=2048) as router:
        big = {"model": "polyspec", "messages": [{"role": "user", "content": "x" * 5000}]}
        assert _error(httpx.post(f"{router.url}/v1/chat/completions", json=big), 413)["code"] == "request_too_large"
        chunks = (b"x" * 1024 for _ in range(4))  # no Content-Length: counted while reading
        assert _error(httpx.post(f"{router.url}/v1/chat/completions", content=chunks), 413)
        assert _error(httpx.post(f"{router.url}/v1/completions", json={"model": "polyspec"}), 400)["param"] == "prompt"
        assert _error(httpx.get(f"{router.url}/v1/nothing-here"), 404)["code"] == "not_found"
        models = httpx.get(f"{router.url}/v1/models").json()
        assert {m["id"] for m in models["data"]} == {"polyspec", MODEL_ID}
    assert error500.completion_requests == 0
