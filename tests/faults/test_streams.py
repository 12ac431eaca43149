"""Streams that end badly reach the client as an SSE error event and are
counted as errors, never as "ok".

The engines are the fake of tests/router/fakes.py: "nodone" ends its chunked body cleanly without
``data: [DONE]`` (an engine that stopped without finishing, which a real vLLM does not do on demand),
"drop" cuts the connection mid-stream, "slow" streams correctly.
"""

from __future__ import annotations

import json

import httpx

from tests.faults.conftest import serve_router, wait_for
from tests.router.fakes import BrokenEngine

ERROR_KEYS = {"message", "type", "param", "code"}


def _stream(url: str, max_tokens: int = 16) -> tuple[int, list[str]]:
    body = {"model": "polyspec", "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Hello, how are you today?"}]}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as resp:
        raw = resp.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), raw  # well-formed SSE to the end
    return resp.status_code, [e[6:] for e in events]


def _requests(url: str) -> dict[str, float]:
    """polyspec_requests_total by status."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name == "polyspec_requests_total":
                out[s.labels["status"]] = out.get(s.labels["status"], 0) + s.value
    return out


def test_stream_that_ends_without_done_gets_an_error_event(registry, registry_url):
    with BrokenEngine("nodone") as fake:
        registry.deploy(None, name="quitter", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url, fail_threshold=100) as router:
            status, events = _stream(router.url)
            assert status == 200
            content = [json.loads(e) for e in events[:2]]
            assert "".join(c["choices"][0]["delta"]["content"] for c in content) == "Hello"
            error = json.loads(events[2])["error"]
            assert set(error) == ERROR_KEYS and error["code"] == "stream_incomplete"
            assert error["type"] == "upstream_error" and "[DONE]" in error["message"]
            assert events[3:] == ["[DONE]"]
            assert wait_for(lambda: _requests(router.url) == {"stream_incomplete": 1}, 5), _requests(router.url)
            metrics = httpx.get(f"{router.url}/metrics").text
            assert 'polyspec_upstream_errors_total{backend="quitter",reason="stream_incomplete"} 1.0' in metrics


def test_cut_stream_gets_an_error_event_and_counts_as_an_error(registry, registry_url):
    with BrokenEngine("drop") as fake:
        registry.deploy(None, name="droppy", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url, fail_threshold=100) as router:
            status, events = _stream(router.url)
            assert status == 200
            assert json.loads(events[2])["error"]["code"] == "stream_interrupted" and events[3:] == ["[DONE]"]
            assert wait_for(lambda: _requests(router.url) == {"stream_error": 1}, 5), _requests(router.url)


def test_complete_streams_stay_ok_with_the_openai_client(registry, registry_url):
    """The openai client hangs up as soon as it reads [DONE]: those streams were served in full."""
    from openai import OpenAI

    with BrokenEngine("slow", slow_interval_s=0.01) as fake:
        registry.deploy(None, name="fine", url=fake.url, languages=["en"], default=True)
        with serve_router(registry_url) as router:
            client = OpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0)
            for _ in range(5):
                chunks = client.chat.completions.create(
                    model="polyspec", stream=True, max_tokens=3,
                    messages=[{"role": "user", "content": "Hello, how are you today?"}])
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "t0 t1 t2 "
            assert wait_for(lambda: _requests(router.url) == {"ok": 5}, 5), _requests(router.url)
