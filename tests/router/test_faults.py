"""Faults and bad requests: every failure comes back as an OpenAI-style error with the right status.

The broken backends are the fake server of tests/router/fakes.py (the only place a fake is allowed).
Failover to a healthy engine is covered with real vLLM engines in test_integration.py.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.router.conftest import chat, openai_error as _error, serve_router
from tests.router.fakes import MODEL_ID, BrokenEngine
from polyspec.core.ports import free_port


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


def test_a_kept_alive_connection_the_engine_drops_is_retried_once_on_a_new_one(registry, registry_url):
    """The engine closes its idle keep-alive connection just as the router reuses it: no byte of an answer
    came, so the request goes once more on a new connection and the client never sees the race."""
    with BrokenEngine("stale") as fake:
        registry.deploy(None, name="stale", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url, fail_threshold=1) as router:
            for i in range(3):
                resp = chat(router.url, f"Hello there, number {i}")
                assert resp.status_code == 200, resp.text
                assert resp.json()["choices"][0]["message"]["content"] == "Hello"
            assert fake.stale_closes == 2 and fake.completion_requests == 5  # 3 answered, 2 dropped unanswered
            metrics = httpx.get(f"{router.url}/metrics").text
            assert "polyspec_upstream_errors_total{" not in metrics
            assert httpx.get(f"{router.url}/ready").status_code == 200  # never marked as failing


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


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HI = b'"messages": [{"role": "user", "content": "hi"}]'


@pytest.mark.parametrize(
    ("path", "content", "headers", "status", "param"),
    [
        (CHAT, b'{"model": "polyspec", "messages": [', {}, 400, None),
        (CHAT, b'{"model": "polyspec", "messages": [{"role": "user", "content": "caf\xe9"}]}', {}, 400, None),
        (COMPLETIONS, b'{"model": "polyspec", "prompt": "caf\xe9 \xff\xfe"}', {}, 400, None),
        (CHAT, b'{"model": "polyspec"}', {}, 400, "messages"),
        (CHAT, b'{"model": "polyspec", "messages": []}', {}, 400, "messages"),
        (CHAT, b'{"model": "polyspec", "messages": "hi"}', {}, 400, "messages"),
        (CHAT, b'{"model": "polyspec", "messages": ["hi"]}', {}, 400, "messages"),
        (CHAT, b'["not", "an", "object"]', {}, 400, None),
        (CHAT, b'{' + HI + b'}', {}, 400, "model"),
        (CHAT, b'{"model": 7, ' + HI + b'}', {}, 400, "model"),
        (CHAT, b'{"model": "gpt-17", ' + HI + b'}', {}, 404, "model"),
        (COMPLETIONS, b'{"model": "polyspec", "prompt": {"text": "hi"}}', {}, 400, "prompt"),
        # Each of these used to escape as a plain-text 500 (or a dropped connection): JSON that json.loads
        # refuses with something other than JSONDecodeError, text no UTF-8 encoder takes, content parts
        # with non-string text, and pinned routing values that cannot go into a response header.
        (CHAT, b'{"model": "polyspec", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, 400, None),
        (CHAT, b'{"model": "polyspec", "max_tokens": ' + b"9" * 5000 + b", " + HI + b"}", {}, 400, None),
        (CHAT, b'{"model": "polyspec", "messages": [{"role": "user", "content": "hi \\ud800"}]}', {}, 400, None),
        (COMPLETIONS, b'{"model": "polyspec", "prompt": "\\udc00 lone"}', {}, 400, None),
        (CHAT, b'{"model": "polyspec", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
         {}, 502, None),  # nothing to classify: default pool, and the engine judges the content
        (CHAT, b'{"model": "polyspec", "polyspec": {"language": "fr\\r\\nX-Evil: 1"}, ' + HI + b"}", {}, 400,
         "polyspec.language"),
        (CHAT, b'{"model": "polyspec", "polyspec": {"domain": "\xd0\xba\xd0\xbe\xd0\xb4"}, ' + HI + b"}", {}, 400,
         "polyspec.domain"),
        (CHAT, b'{"model": "polyspec", ' + HI + b"}", {"X-Polyspec-Language": "x" * 300}, 400, "X-Polyspec-Language"),
    ],
    ids=["bad-json", "invalid-utf8", "invalid-utf8-completions", "missing-messages", "empty-messages",
         "messages-not-list", "message-not-object", "not-object", "missing-model", "model-not-string",
         "unknown-model", "prompt-not-text", "nested-100k", "int-5000-digits", "lone-surrogate",
         "lone-surrogate-completions", "text-part-not-string", "pinned-language-crlf", "pinned-domain-cyrillic",
         "pinned-language-300-chars"],
)
def test_bad_requests(error500, registry_url, path, content, headers, status, param):
    """Every malformed request gets an OpenAI-style error; only a well-formed one may reach an engine."""
    with serve_router(registry_url, fail_threshold=100) as router:
        resp = httpx.post(f"{router.url}{path}", content=content,
                          headers={"content-type": "application/json", **headers})
        assert _error(resp, status)["param"] == param
        assert error500.completion_requests == (1 if status == 502 else 0)
        assert not any(k.startswith("x-polyspec") or "evil" in k for k in resp.headers)


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


def test_registry_source_never_recreates_a_deleted_sqlite_file(registry, registry_url, tmp_path):
    """An open SQLite connection goes on reading a deleted file; the router's source must notice instead, keep
    failing (the router then keeps its last table) without creating an empty registry, and read the file
    again once it is restored (the same under a router: test_faults_engines.py)."""
    import shutil
    import sqlite3
    from contextlib import closing
    from pathlib import Path

    from polyspec.router.source import RegistrySource

    registry.deploy(None, name="en-1", url="http://127.0.0.1:9", languages=["en"], default=True)
    path = Path(registry_url.removeprefix("sqlite:///"))
    source = RegistrySource(registry_url)
    assert [d.name for d in source.deployments()] == ["en-1"]
    backup = sqlite3.connect(tmp_path / "backup.db")
    with closing(sqlite3.connect(path)) as live, closing(backup):
        live.backup(backup)  # WAL content included
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    from polyspec.registry import RegistryMissing

    for _ in range(2):
        with pytest.raises(RegistryMissing, match="missing|does not exist"):
            source.deployments()
    assert not path.exists()
    shutil.copy(tmp_path / "backup.db", path)
    from polyspec.registry import open_registry

    with open_registry(registry_url) as reg:
        reg.deploy(None, name="fr-1", url="http://127.0.0.1:10", languages=["fr"])
    assert sorted(d.name for d in source.deployments()) == ["en-1", "fr-1"]
