"""bench/python_floor.py, the router benchmark's floor: it relays answers and streams unchanged, so its CPU per
request is the stack's, not a shortcut's (a floor that dropped the body or cut streams would look cheap). The
same under each HTTP server that bench/server_floor.py compares (uvicorn, granian's ASGI and RSGI)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from bench.python_floor import SERVERS
from bench.servers import start_backend, start_python_floor

BODY = {"model": "polyspec", "messages": [{"role": "user", "content": "Bonjour"}], "max_tokens": 16}


@pytest.fixture(scope="module", params=SERVERS)
def floor(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    workdir: Path = tmp_path_factory.mktemp("floor")
    backend = start_backend(workdir, None, tokens=5)
    try:
        server = start_python_floor(workdir, backend.url, None, server=request.param)
        try:
            yield backend.url, server.url
        finally:
            server.stop()
    finally:
        backend.stop()


def test_the_floor_relays_answers_and_streams_as_the_backend_sent_them(floor) -> None:
    backend, url = floor
    for path in ("/v1/chat/completions", "/v1/completions"):
        direct = httpx.post(backend + path, json=BODY, timeout=10)
        relayed = httpx.post(url + path, json=BODY, timeout=10)
        assert relayed.status_code == 200 and relayed.headers["content-type"].startswith("application/json")
        assert {**relayed.json(), "created": 0} == {**direct.json(), "created": 0}
    with httpx.stream("POST", url + "/v1/chat/completions", json={**BODY, "stream": True}, timeout=10) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [e for e in resp.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:-1]] == ["tok "] * 5


def test_the_floor_answers_health_and_refuses_other_paths(floor) -> None:
    _, url = floor
    assert httpx.get(url + "/health", timeout=5).json() == {"status": "ok"}
    assert httpx.get(url + "/v1/models", timeout=5).status_code == 404
    assert httpx.post(url + "/admin", json={}, timeout=5).status_code == 404
