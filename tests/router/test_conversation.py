"""Language ID sees the conversation: earlier user turns count when the last one is short.

Through a served router (its X-Polyspec-Language response header names the language it routed under; the
engines are fakes that start a 200 stream and cut it), and on the body reader for the hostile shapes.
"""

from __future__ import annotations

import json
import time

import httpx
import msgspec
import pytest

from polyspec.router.edge.body import EARLIER_TURN_BYTES, EARLIER_TURNS, MESSAGES_READ, _string_head, decode_body, read_prompt
from polyspec.router.decision.classify import classify
from tests.router.conftest import add_draft, serve_router
from tests.router.fakes import BrokenEngine

ENGLISH = ["Could you explain how photosynthesis works in green plants, step by step, with the chemistry involved?",
           "Thanks. Now tell me how the Calvin cycle turns carbon dioxide into sugars inside the chloroplast."]
FRENCH = ["Pouvez-vous m'expliquer comment fonctionne la photosynthèse chez les plantes vertes, étape par étape ?",
          "Merci. Maintenant, dites-moi comment le cycle de Calvin transforme le dioxyde de carbone en sucres."]
CODE_ONLY = "```python\nprint(sum(range(10)))\n```"


def conversation(earlier: list[str], last: str | list) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in earlier:
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": "Of course: here it is."}]
    return messages + [{"role": "user", "content": last}]


@pytest.fixture()
def router(registry, registry_url, fake_verifier, fake_draft_dir):
    """A served router with an en (default) and a fr pool, both on fake engines."""
    engines = {lang: BrokenEngine("drop") for lang in ("en", "fr")}
    for engine in engines.values():
        engine.__enter__()
    try:
        for lang, engine in engines.items():
            ref = add_draft(registry, fake_draft_dir, fake_verifier.name, f"{lang}-draft", [lang], {lang: 2.0})
            registry.deploy(ref, name=f"{lang}-engine", url=engine.url, default=(lang == "en"))
        with serve_router(registry_url, fail_threshold=1000) as served:
            yield served
    finally:
        for engine in engines.values():
            engine.__exit__(None, None, None)


def routed(router, messages: list[dict]) -> tuple[str, float]:
    """The language and confidence the router routed these messages under."""
    body = json.dumps({"model": "polyspec", "stream": True, "messages": messages})
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", content=body,
                      headers={"Content-Type": "application/json"}, timeout=30) as resp:
        assert resp.status_code == 200, resp.read()
        return resp.headers["x-polyspec-language"], float(resp.headers["x-polyspec-confidence"])


def test_a_short_turn_keeps_its_own_language_whatever_came_before(router):
    assert routed(router, conversation(ENGLISH, "Et maintenant, en français ?"))[0] == "fr"
    assert routed(router, conversation(FRENCH, "And now in English, please?"))[0] == "en"


def test_an_uninformative_last_turn_takes_the_conversations_language(router):
    assert routed(router, conversation([], CODE_ONLY)) == ("en", 0.0)  # nothing to read: the default, unsure
    language, confidence = routed(router, conversation(FRENCH, CODE_ONLY))
    assert language == "fr" and confidence > 0.9
    assert routed(router, conversation(ENGLISH, CODE_ONLY))[0] == "en"
    # "2" tells langid next to nothing (English at 0.13): the conversation decides.
    assert routed(router, conversation([], "2")) == ("en", pytest.approx(0.125, abs=0.01))
    language, confidence = routed(router, conversation(FRENCH, "2"))
    assert language == "fr" and confidence > 0.8
    assert routed(router, conversation(ENGLISH, "2"))[0] == "en"


def test_the_nearest_earlier_turns_count_first(router):
    # French long ago, English just before the short turn: only the nearest EARLIER_TURNS are read.
    earlier = FRENCH * 3 + ENGLISH * (EARLIER_TURNS // 2)
    assert routed(router, conversation(earlier, CODE_ONLY))[0] == "en"


def test_hostile_conversations_are_routed_at_a_bounded_cost(router):
    tiny = [{"role": "user", "content": "ok"}] * 10_000
    start = time.perf_counter()
    assert routed(router, [{"role": "user", "content": FRENCH[0]}] + tiny)[0] == "en"  # French is far back: unread
    huge = (FRENCH[0] + " ") * (900_000 // len(FRENCH[0]))  # about 900 KB, within the 1 MB body limit
    assert routed(router, conversation([huge], CODE_ONLY))[0] == "fr"
    # Content parts: a part larger than EARLIER_TURN_BYTES is skipped (English here), the others are read.
    parts = [{"type": "text", "text": ENGLISH[0] * 8000}, {"type": "text", "text": FRENCH[0]}]
    assert routed(router, conversation([], CODE_ONLY)[:1] + [{"role": "user", "content": parts},
                                                             {"role": "user", "content": CODE_ONLY}])[0] == "fr"
    assert time.perf_counter() - start < 10  # three requests; seconds would mean a full decode or a scan per turn


def test_earlier_turns_are_read_within_bounds():
    messages = conversation(["x"] * 10 + ["a" * 5_000_000], "ok")
    body, strict = decode_body(json.dumps({"model": "m", "messages": messages}).encode())
    prompt = read_prompt(body, "chat")
    assert strict and prompt.text == "ok" and len(prompt.earlier) <= MESSAGES_READ - 1
    turns = prompt.earlier_turns()
    assert len(turns) == EARLIER_TURNS and len(turns[0]) <= EARLIER_TURN_BYTES and turns[1:] == ["x"] * 3
    # Odd shapes among earlier messages are skipped, never a 400: the router did not read them before.
    odd = [{"role": "user", "content": "Bonjour à tous"}, "not an object", {"role": "user", "content": 7},
           {"role": "user", "content": [{"type": "image_url"}]}, {"role": "user", "content": "ok"}]
    body, _ = decode_body(json.dumps({"model": "m", "messages": odd}).encode())
    assert read_prompt(body, "chat").earlier_turns() == ["", "", "Bonjour à tous"]
    # A body json had to read (a surrogate-pair escape in it) gives the same turns (the first cut in
    # characters, not bytes).
    lenient = json.dumps({"model": "m", "t": "\U0001F600", "messages": messages}).encode()
    body, strict = decode_body(lenient)
    again = read_prompt(body, "chat").earlier_turns()
    assert not strict and again[1:] == turns[1:] and again[0].startswith(turns[0]) and len(again[0]) <= EARLIER_TURN_BYTES
    assert read_prompt({"prompt": "Bonjour"}, "completions").earlier_turns() == []


@pytest.mark.parametrize("ascii_only", [False, True])
def test_a_string_head_never_splits_a_character_or_an_escape(ascii_only):
    text = 'héllo "wörld" \\ back \t 😀 日本語 ' * 40
    raw = json.dumps(text, ensure_ascii=ascii_only).encode()
    for limit in range(1, 600):
        head = _string_head(msgspec.Raw(raw), limit)
        assert text.startswith(head) and len(head.encode()) <= limit


def test_classify_weighs_the_last_turn_first():
    def decide(earlier: list[str], last: str):
        body = {"model": "m", "messages": conversation(earlier, last)}
        return classify(body, "chat", {}, {}, {"en", "fr", "de"}, "en", 0.4, 500)

    sure = decide(ENGLISH, "Et maintenant, en français ?")
    assert (sure.language, sure.source) == ("fr", "langid") and sure.text == "Et maintenant, en français ?"
    alone, filled = decide([], "yes"), decide(FRENCH, "yes")
    assert (alone.language, alone.source) == ("en", "fallback")  # English, but at 0.14
    assert (filled.language, filled.source, filled.text) == ("fr", "langid", "yes")
    assert decide([], CODE_ONLY).source == "fallback"
    assert decide(FRENCH, CODE_ONLY).detected == "fr"
