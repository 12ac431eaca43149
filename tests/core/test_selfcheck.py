"""The self-check's comparison, without an engine: exact agreement, top-5 tolerance, mismatch, and the files.

The "engines" here are tiny deterministic functions of the context (and one behind an HTTP transport that
speaks vLLM's /v1/completions), so each case is exact; what is under test is the comparison itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from polyspec.core.errors import InvalidInput
from polyspec.core.selfcheck import (
    Reference,
    ReferenceCase,
    SelfCheckFailed,
    check_case,
    check_engine,
    compare,
    likely_cause,
    load_reference,
    reference_key,
    reference_path,
)

PROMPT = [1, 2, 3]
TOKENS = [10, 11, 12, 13, 14, 15]
# The reference's top-5 at each position; the greedy token first.
TOP = [[t, t + 100, t + 200, t + 300, t + 400] for t in TOKENS]
CASE = ReferenceCase(prompt="q", prompt_ids=PROMPT, tokens=TOKENS, top=TOP, text="")
REFERENCE = Reference(key="k", verifier="v", max_tokens=len(TOKENS), top_k=5, cases=[CASE])
GARBAGE = 7777  # a token in no top-5


def engine(flip_at: dict[int, int] | None = None, off_track: int = GARBAGE):
    """A greedy 'engine' that follows the reference while its context is the reference's; at the positions
    in ``flip_at`` it picks that token instead, and once its own text has left the reference's it emits
    ``off_track`` (as a real model would continue a different text). Records every request."""
    flip_at = flip_at or {}
    calls: list[tuple[list[int], int]] = []

    def generate(prompt_ids: list[int], max_tokens: int) -> list[int]:
        calls.append((list(prompt_ids), max_tokens))
        context = list(prompt_ids)
        out: list[int] = []
        for _ in range(max_tokens):
            pos = len(context) - len(PROMPT)
            on_track = context[len(PROMPT):] == TOKENS[:pos]
            token = flip_at.get(pos, TOKENS[pos]) if on_track else off_track
            out.append(token)
            context.append(token)
        return out

    generate.calls = calls  # type: ignore[attr-defined]
    return generate


def test_exact_agreement_takes_one_request() -> None:
    gen = engine()
    result = check_case(CASE, gen)
    assert result.ok and result.exact == len(TOKENS) and result.tolerated == 0 and result.requests == 1
    assert gen.calls == [(PROMPT, len(TOKENS))]


def test_top5_flip_is_tolerated_and_the_rest_compared_along_the_reference() -> None:
    gen = engine(flip_at={2: TOP[2][3]})  # a near-tie flipped by numerics: the reference's 4th choice
    result = check_case(CASE, gen)
    assert result.ok and result.tolerated == 1 and result.exact == len(TOKENS) - 1 and result.tolerated_at == [2]
    # Re-anchored on prompt + reference prefix through position 2, asking for the remaining 3 tokens.
    assert gen.calls[1] == (PROMPT + TOKENS[:3], len(TOKENS) - 3)
    assert result.requests == 2


def test_without_reanchoring_the_flip_would_look_like_garbage() -> None:
    # The engine's own continuation after a legitimate flip is off the reference: comparing it naively would
    # fail a healthy engine. This is what the re-anchoring protects against.
    gen = engine(flip_at={2: TOP[2][1]})
    free_run = gen(PROMPT, len(TOKENS))
    assert free_run[3:] == [GARBAGE] * 3
    assert check_case(CASE, engine(flip_at={2: TOP[2][1]})).ok


def test_token_outside_top5_fails_and_names_the_position() -> None:
    result = check_case(CASE, engine(flip_at={1: GARBAGE}))
    assert not result.ok
    assert (result.position, result.engine_token, result.expected) == (1, GARBAGE, TOKENS[1])
    assert result.exact == 1 and result.engine_tokens[:2] == [TOKENS[0], GARBAGE]


def test_flip_then_mismatch_later_still_fails() -> None:
    result = check_case(CASE, engine(flip_at={0: TOP[0][2], 4: GARBAGE}))
    assert not result.ok and result.position == 4 and result.tolerated == 1


def test_every_position_flipped_within_top5_passes_with_bounded_requests() -> None:
    result = check_case(CASE, engine(flip_at={i: TOP[i][4] for i in range(len(TOKENS))}))
    assert result.ok and result.tolerated == len(TOKENS) and result.requests == len(TOKENS)


def test_empty_or_overlong_engine_output() -> None:
    assert not check_case(CASE, lambda ids, n: []).ok
    # Extra tokens beyond what was asked are ignored, not compared against positions that do not exist.
    assert check_case(CASE, lambda ids, n: (TOKENS + [GARBAGE] * 9)[len(ids) - len(PROMPT):][: n + 9]).ok


def test_report_over_several_prompts() -> None:
    other = ReferenceCase(prompt="p2", prompt_ids=[9], tokens=[5], top=[[5, 6, 7, 8, 9]])
    ref = Reference(key="k2", verifier="v", max_tokens=6, top_k=5, cases=[CASE, other])
    report = compare(ref, lambda ids, n: [GARBAGE] * n)
    assert not report.ok and len(report.failed) == 2 and report.reference == "k2"
    assert "FAIL (2/2 prompts)" in report.summary()
    assert report.to_json()["cases"][0]["position"] == 0


def test_likely_cause_names_bf16_without_native_support() -> None:
    assert "use --dtype float32" in likely_cause(dtype="bfloat16", device="cpu", native_bf16=False)
    assert "bf16 on a CPU (without AMX)" in likely_cause(dtype="bfloat16", native_bf16=False)
    assert "bf16 on a CPU (with AMX)" in likely_cause(dtype="bfloat16", native_bf16=True)  # AMX is no cure
    assert "bf16 on a CPU" not in likely_cause(dtype="bfloat16", device="cuda")
    assert "served weights" in likely_cause(dtype="float32")
    assert "without the draft" in likely_cause(dtype="float32", draft=True)


def _vllm_like(flip_at: dict[int, int]) -> httpx.MockTransport:
    gen = engine(flip_at)

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert request.url.path == "/v1/completions"
        assert body["temperature"] == 0 and body["ignore_eos"] and body["return_token_ids"]
        tokens = gen(body["prompt"], body["max_tokens"])
        return httpx.Response(200, json={"choices": [{"text": "", "token_ids": tokens}]})

    return httpx.MockTransport(handler)


def test_check_engine_over_http_passes_and_fails_loudly() -> None:
    ok = check_engine("http://e", "m", REFERENCE, dtype="float32",
                      client=httpx.Client(transport=_vllm_like({2: TOP[2][1]})))
    assert ok.ok and ok.cases[0].tolerated == 1
    with pytest.raises(SelfCheckFailed) as err:
        check_engine("http://e:1", "m", REFERENCE, dtype="bfloat16", native_bf16=False,
                     client=httpx.Client(transport=_vllm_like({0: GARBAGE})))
    message = str(err.value)
    assert "engine http://e:1 failed its self-check" in message and "token 0" in message
    assert "bf16 on a CPU (without AMX)" in message and "--dtype float32" in message
    assert err.value.exit_code == 6 and err.value.details()["ok"] is False


def test_engine_that_refuses_or_returns_no_ids() -> None:
    refusing = httpx.MockTransport(lambda r: httpx.Response(400, json={"error": "bad"}))
    with pytest.raises(SelfCheckFailed, match="HTTP 400"):
        check_engine("http://e", "m", REFERENCE, dtype="float32", client=httpx.Client(transport=refusing))
    no_ids = httpx.MockTransport(lambda r: httpx.Response(200, json={"choices": [{"text": "x"}]}))
    with pytest.raises(SelfCheckFailed, match="no token_ids"):
        check_engine("http://e", "m", REFERENCE, dtype="float32", client=httpx.Client(transport=no_ids))


def test_reference_file_round_trip_and_hostile_files(tmp_path: Path) -> None:
    path = reference_path(tmp_path, "abc")
    assert load_reference(path) is None
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(REFERENCE.to_json()))
    assert load_reference(path) == REFERENCE
    for bad in ("not json", "[]", json.dumps({**REFERENCE.to_json(), "format": 99}),
                json.dumps({**REFERENCE.to_json(), "cases": [{**CASE.__dict__, "top": []}]}),
                json.dumps({**REFERENCE.to_json(), "cases": [{"prompt": "x"}]})):
        path.write_text(bad)
        with pytest.raises(InvalidInput):
            load_reference(path)


def test_reference_key_follows_weights_and_prompts(tmp_path: Path) -> None:
    model = tmp_path / "verifier"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"a" * 10)
    key = reference_key(model)
    assert reference_key(model) == key
    assert reference_key(model, prompts=("other",)) != key
    (model / "model.safetensors").write_bytes(b"b" * 11)  # a rewritten weights file
    assert reference_key(model) != key
    assert reference_key("org/name") == reference_key("org/name")  # a hub id: keyed by its name
