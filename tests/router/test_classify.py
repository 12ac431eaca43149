"""Classification (real fastText langid), the torch-free import rule, capture and the langid CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polyspec.core.domains import detect_domain
from polyspec.router.edge.body import prompt_text
from polyspec.router.decision.classify import classify, pop_router_fields
from polyspec.router.engine.job import forwarded_headers
from polyspec.router.errors import BadRequest

ROOT = Path(__file__).resolve().parents[2]


def _chat(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": "Réponds en anglais."},
                                       {"role": "user", "content": text}]}


def _classify(body: dict, kind: str = "chat", headers: dict | None = None, pins: dict | None = None, threshold=0.5,
              domains: tuple[str, ...] = ()):
    return classify(body, kind, headers or {}, pins or {}, {"en", "fr", "de"}, "en", threshold, 500, domains=domains)


def test_last_user_message_decides_language_not_the_system_prompt():
    d = _classify(_chat("What is the tallest mountain in Europe, and how high is it?"))
    assert (d.language, d.source, d.domain) == ("en", "langid", "general") and d.confidence > 0.9
    parts = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Quelle est la plus haute montagne d'Europe ?"}, {"type": "image_url"}]}]}
    assert _classify(parts).language == "fr"


def test_code_and_urls_do_not_drown_the_prose_language():
    text = ("Peux-tu m'expliquer pourquoi cette fonction renvoie toujours None ? Voir https://example.com/docs\n"
            "```python\ndef total(items):\n    for item in items:\n        sum += item.price\n```")
    d = _classify(_chat(text))
    assert d.language == "fr" and d.domain == "code"
    assert detect_domain("def f(x):\n    return x + 1\nprint(f(2)) == 3") == "code"
    assert detect_domain("Write a short poem about the sea in spring.") == "general"


def test_pins_threshold_and_completions_prompt():
    body = _chat("Bonjour, je voudrais réserver une table pour deux personnes ce soir.")
    assert _classify(body, headers={"x-polyspec-language": "DE"}).language == "de"
    pinned = _classify(body, pins={"language": "en", "domain": "legal"}, domains=("legal",))  # a table's domain
    assert (pinned.language, pinned.domain, pinned.source, pinned.confidence) == ("en", "legal", "body", 1.0)
    short = _classify(_chat("salut"))  # fastText says fr with a low score
    assert (short.language, short.detected, short.source) == ("en", "fr", "fallback") and short.confidence < 0.5
    assert _classify(_chat("salut"), threshold=0.0).language == "fr"
    assert _classify({"prompt": "Es war einmal ein kleiner Hund, der im Wald lebte."}, "completions").language == "de"
    assert _classify({"prompt": [1, 2, 3]}, "completions").source == "fallback"


def test_router_fields_and_headers_are_removed():
    body = {"model": "m", "polyspec": {"language": "fr"}, "messages": []}
    assert pop_router_fields(body) == {"language": "fr"} and "polyspec" not in body
    kept = forwarded_headers({"Authorization": "Bearer k", "X-Polyspec-Language": "fr", "Host": "h",
                              "Content-Length": "3", "content-type": "text/plain", "X-Request-Id": "r",
                              "Accept-Encoding": "gzip", "Connection": "close", "TE": "trailers", "X-Bad": "a\r\nb: c"})
    assert kept == b"Authorization: Bearer k\r\nX-Request-Id: r\r\nContent-Type: application/json\r\n"
    with pytest.raises(BadRequest):
        prompt_text({"messages": ["not an object"]}, "chat")
    with pytest.raises(BadRequest):
        prompt_text({"prompt": 42}, "completions")


def test_capture_writes_training_schema(tmp_path):
    import asyncio

    from polyspec.core.prompts import read_prompt_records
    from polyspec.router.capture import PromptCapture

    async def capture() -> dict:
        cap = PromptCapture(tmp_path / "capture", "r1")
        cap.start()
        cap.submit("fr", "general", "Bonjour à tous")
        cap.submit("fr", "code", "Corrige ce code")
        cap.submit("../etc", "general", "x")  # not a language code: never a path
        await cap.stop()
        return cap.stats()

    stats = asyncio.run(capture())
    assert stats["written"] == 2 and stats["dropped"] == {"unsafe_language": 1}
    lines = (tmp_path / "capture" / "fr.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["prompt"] for r in records] == ["Bonjour à tous", "Corrige ce code"]
    assert set(records[0]) == {"id", "lang", "domain", "prompt", "source", "license"}
    assert records[0]["id"] != records[1]["id"] and records[1]["domain"] == "code"
    assert records[0]["source"] == "polyspec-router:r1"
    # The file is a training prompts file as it is.
    assert [r.text for r in read_prompt_records(tmp_path / "capture" / "fr.jsonl")] == [r["prompt"] for r in records]


def test_langid_cli_json_contract():
    lines = "Bonjour, comment allez-vous aujourd'hui ?\nThe weather is lovely this afternoon.\n"
    out = subprocess.run([sys.executable, "-m", "polyspec.cli", "langid", "--json"], input=lines, text=True,
                         capture_output=True, check=True, cwd=ROOT).stdout.splitlines()
    rows = [json.loads(line) for line in out]
    assert [r["language"] for r in rows] == ["fr", "en"] and all(0.5 < r["confidence"] <= 1 for r in rows)
    restricted = subprocess.run([sys.executable, "-m", "polyspec.cli", "langid", "--json", "--restrict", "de,es"],
                                input="Bonjour, comment allez-vous ?\n", text=True, capture_output=True, check=True,
                                cwd=ROOT).stdout
    assert json.loads(restricted)["language"] in {"de", "es"}
    table = subprocess.run([sys.executable, "-m", "polyspec.cli", "langid"], input=lines, text=True,
                           capture_output=True, check=True, cwd=ROOT).stdout
    assert "fr" in table and "confidence" in table
    bad = subprocess.run([sys.executable, "-m", "polyspec.cli", "langid", "--restrict", ","], input="x\n", text=True,
                         capture_output=True, cwd=ROOT)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
