"""Hostile bodies cost a bounded, linear amount and never freeze the router.

A 40 KB body of newlines around code cues and an e-mail-shaped run once froze the whole router,
/health included, for seconds (quadratic regexes in domain and language detection). Classification now
reads a bounded head and tail of the text with linear patterns, and a body is decoded top level only
(router.edge.body), so the event loop stays free while such bodies are in flight.
"""

from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
import msgspec
import pytest

from polyspec.core.domains import detect_domain
from polyspec.core.langid import clean_for_langid
from polyspec.core.text import WINDOW, head_and_tail
from polyspec.router.edge.body import MESSAGES_READ, PARTS_READ, decode_body, encode_body, field, prompt_text
from polyspec.router.errors import BadRequest
from tests.router.conftest import serve_router

NEWLINES = "\n" * 40_000
# Each of these took seconds through the old patterns (measured: 3.2 s for the e-mail run alone).
HOSTILE_TEXTS = {
    "newlines-code-cues": "def" + NEWLINES + "import os" + NEWLINES + "#include <x>" + NEWLINES + "@",
    "newlines-at": "@" + NEWLINES + "@",
    "email-run": "a." * 20_000 + " @",
    "email-tail": "x@" + "a-" * 20_000,
    "indent-lists": "    -\n" * 8000,
}


def _chat(text: str) -> dict:
    return {"model": "polyspec", "max_tokens": 1, "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEXTS))
def test_classification_reads_only_a_bounded_window(name):
    """The result on a huge text is the result on its head and tail: the rest is never read."""
    text = HOSTILE_TEXTS[name] * 25  # about 1 MB
    assert clean_for_langid(text, 500) == clean_for_langid(head_and_tail(text, WINDOW), 500)
    assert detect_domain(text) == detect_domain(head_and_tail(text, WINDOW))


def test_health_answers_while_hostile_bodies_are_in_flight(error500, registry_url):
    """The issue's reproduction: /health keeps answering within 50 ms while hostile bodies are processed."""
    bodies = [json.dumps(_chat(t)).encode() for t in HOSTILE_TEXTS.values()]
    with serve_router(registry_url, fail_threshold=10_000) as router:
        url = f"{router.url}/v1/chat/completions"
        stop = threading.Event()
        hostile_latencies: list[float] = []

        def attack() -> None:
            with httpx.Client(timeout=30) as client:
                while not stop.is_set():
                    for body in bodies:
                        t0 = time.perf_counter()
                        resp = client.post(url, content=body, headers={"content-type": "application/json"})
                        hostile_latencies.append(time.perf_counter() - t0)
                        assert resp.status_code == 502, resp.text  # routed, then the broken engine's 500

        attackers = [threading.Thread(target=attack, daemon=True)]  # one: the 2-core CI machine runs us too
        for thread in attackers:
            thread.start()
        health: list[float] = []
        with httpx.Client(timeout=10) as client:
            client.get(f"{router.url}/health")  # connection up before timing
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                assert client.get(f"{router.url}/health").status_code == 200
                health.append(time.perf_counter() - t0)
                time.sleep(0.01)
        stop.set()
        for thread in attackers:
            thread.join(30)
    assert len(hostile_latencies) >= len(bodies), "the hostile bodies were not sent"
    health.sort()
    p95 = health[int(0.95 * (len(health) - 1))]
    assert p95 < 0.050, f"/health p95 {p95 * 1000:.1f} ms (median {statistics.median(health) * 1000:.1f} ms)"
    assert health[-1] < 0.250, f"/health stalled {health[-1] * 1000:.0f} ms"
    assert max(hostile_latencies) < 1.0, f"a hostile body took {max(hostile_latencies):.2f} s"


def test_many_messages_read_only_near_the_end():
    """100,000 messages: the last user message among the last MESSAGES_READ decides; the rest is not decoded."""
    messages = [{"role": "user", "content": "old"}] + [{"role": "assistant", "content": "a"}] * 100_000
    raw = json.dumps({"model": "m", "messages": messages[:-1] + [{"role": "user", "content": "Bonjour !"}]}).encode()
    body, strict = decode_body(raw)
    assert strict and prompt_text(body, "chat") == "Bonjour !"
    far = json.dumps({"model": "m", "messages": messages}).encode()  # the only user message is far back
    body, _ = decode_body(far)
    assert prompt_text(body, "chat") == "a"  # the last message's text, as when no user message exists
    near = messages[: 1] + messages[1: MESSAGES_READ - 1]
    body, _ = decode_body(json.dumps({"model": "m", "messages": near}).encode())
    assert prompt_text(body, "chat") == "old"


def test_many_content_parts_read_from_both_ends():
    parts = [{"type": "text", "text": "head"}] + [{"type": "image_url"}] * 150_000 + [{"type": "text", "text": "tail"}]
    body, _ = decode_body(json.dumps({"model": "m", "messages": [{"role": "user", "content": parts}]}).encode())
    assert prompt_text(body, "chat") == "head\ntail"
    middle = [{"type": "image_url"}] * PARTS_READ + [{"type": "text", "text": "unread"}] + [{"type": "image_url"}] * PARTS_READ
    body, _ = decode_body(json.dumps({"model": "m", "messages": [{"role": "user", "content": middle}]}).encode())
    assert prompt_text(body, "chat") == ""


@pytest.mark.parametrize("prompt, text", [
    (list(range(600_000)), ""),  # token ids: nothing to classify, nothing decoded one by one
    ([[1, 2], [3]], ""),
    (["first", 7, "last"], "last"),
    ("plain", "plain"),
])
def test_completion_prompts_of_every_shape(prompt, text):
    body, strict = decode_body(json.dumps({"model": "m", "prompt": prompt}).encode())
    assert strict and prompt_text(body, "completions") == text


def test_reencoded_body_is_the_same_json_with_the_routers_changes():
    original = {"model": "polyspec", "messages": [{"role": "user", "content": "héllo \u2028 \"q\""}], "n": 1.5,
                "stream": True, "polyspec": {"language": "fr"}, "tools": [{"a": [1, {"b": None}]}]}
    body, strict = decode_body(json.dumps(original).encode())
    assert strict and field(body, "stream") is True and field(body, "model") == "polyspec"
    body.pop("polyspec")
    body["stream_options"] = {"include_usage": True}
    body["model"] = "engine-model"
    expected = {k: v for k, v in original.items() if k != "polyspec"} | {"stream_options": {"include_usage": True},
                                                                         "model": "engine-model"}
    assert json.loads(encode_body(body, strict)) == expected


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "messages": [{"role": "user", "content": "x \\ud800"}]}',
    b'{"model": "m", "max_tokens": ' + b"9" * 5000 + b', "messages": []}',
])
def test_what_python_refuses_is_judged_by_json(raw):
    with pytest.raises(BadRequest):
        decode_body(raw)


def test_oversized_small_fields_are_refused_not_decoded():
    raw = json.dumps({"model": "m" * 10_000, "messages": [{"role": "user", "content": "hi"}]}).encode()
    body, _ = decode_body(raw)
    with pytest.raises(BadRequest, match="'model' is too large"):
        field(body, "model")
    assert isinstance(body["messages"], msgspec.Raw)  # left as a slice of the body, copied on re-encode


NON_STANDARD_NUMBERS = {
    "top-level NaN": b'{"model": "polyspec", "temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}',
    "Infinity": b'{"model": "polyspec", "max_tokens": Infinity, "messages": [{"role": "user", "content": "hi"}]}',
    "nested -Infinity": b'{"model": "polyspec", "messages": [{"role": "user", "content": "hi"}], '
                        b'"logit_bias": {"42": -Infinity}, "tools": [{"x": [1, {"y": NaN}]}]}',
    "completions NaN": b'{"model": "polyspec", "prompt": "hi", "top_p": NaN}',
}


@pytest.mark.parametrize("name", sorted(NON_STANDARD_NUMBERS))
def test_nan_and_infinity_are_refused_like_other_malformed_json(error500, registry_url, name):
    """Python's json accepts NaN, Infinity and -Infinity; they are no JSON, and were forwarded to the engine."""
    raw = NON_STANDARD_NUMBERS[name]
    path = "/v1/completions" if b'"prompt"' in raw else "/v1/chat/completions"
    with serve_router(registry_url, fail_threshold=100) as router:
        resp = httpx.post(f"{router.url}{path}", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request"
    assert "is not a JSON number (JSON has no NaN or Infinity)" in error["message"]
    assert error500.completion_requests == 0  # nothing reached the engine
