"""router.calibrate on a fake engine with a known cost model (no vLLM): the step time, the prefill per prompt
token and the step's growth per context token it reports are the engine's, and no prefill request reuses a prompt
a prefix cache could serve."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from polyspec.core.speed import ContextCost, request_seconds
from polyspec.router import calibrate

STEP_S = 0.08  # seconds per verify step of the fake engine
PREFILL_S = 0.004  # seconds per prompt token
TOKENS_PER_STEP = 2
CONTEXT_S = 0.00005  # seconds a step grows per token of context


CHAT_TEMPLATE_TOKENS = 12  # what the fake engine's chat template adds to a user turn


def chat_tokens(text: str) -> int:
    return len(text.split()) + CHAT_TEMPLATE_TOKENS


class FakeEngine:
    """Answers /v1/models, /v1/completions and /v1/chat/completions; each request advances a fake clock by its
    prefill and steps (a chat turn's prompt is its words and the template's tokens)."""

    def __init__(self, *, report_prompt_tokens: bool = True, context_s: float = 0.0, overhead_s: float = 0.0) -> None:
        self.now = 0.0
        self.context_s, self.overhead_s = context_s, overhead_s
        self.prompts: list[str] = []
        self.chat_prompts: list[str] = []
        self.report_prompt_tokens = report_prompt_tokens

    def clock(self) -> float:
        return self.now

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "fake"}]})
        body = json.loads(request.content)
        chat = request.url.path == "/v1/chat/completions"
        text = body["messages"][-1]["content"] if chat else body["prompt"]
        self.prompts.append(text)
        self.chat_prompts += [text] if chat else []
        prompt_tokens = chat_tokens(text) if chat else len(text.split())
        tokens = body["max_tokens"]
        # the first token comes with prefill (no verify step, as vLLM counts them); each further step attends over
        # the prompt and half the answer; every request pays the overhead
        steps = 0 if tokens <= 1 else -(-tokens // TOKENS_PER_STEP)
        decode = steps * (STEP_S + self.context_s * (prompt_tokens + tokens / 2))
        self.now += self.overhead_s + prompt_tokens * PREFILL_S + decode
        usage = {"completion_tokens": tokens, **({"prompt_tokens": prompt_tokens} if self.report_prompt_tokens else {})}
        return httpx.Response(200, json={"usage": usage, "metrics": {"speculative_decoding": {"num_spec_steps": steps}}})


def _run(engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, waves: int = 3) -> list[calibrate.Point]:
    monkeypatch.setattr(calibrate.time, "perf_counter", engine.clock)
    found = asyncio.run(calibrate.calibrate_engines({"e": ("http://engine", True)}, batches=[1], waves=waves,
                                                    max_tokens=64, transport=httpx.MockTransport(engine.handle)))
    result = found["e"]
    assert isinstance(result, list), result
    return result


def test_prefill_per_prompt_token_is_measured_apart_from_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine()
    [point] = _run(engine, monkeypatch)
    assert point.details["prefill_s_per_token"] == pytest.approx(PREFILL_S)
    # The step waves are chat turns of traffic's length, and their steps hold the prefill of those prompts: wall time
    # over steps, as the router measures it; the details say how long a prompt that is.
    waves = engine.chat_prompts[1:]  # after the warm-up
    held = sum(chat_tokens(p) for p in waves) / len(waves)
    assert len(waves) == 3 and point.details["prompt_tokens"] == pytest.approx(held) and held > 50
    assert point.step_s == pytest.approx(STEP_S + held * PREFILL_S / 32, rel=0.05)
    # Every request but the plain warm-ups opens with its own tag: no prefix cache can serve one from another.
    tagged = [p for p in engine.prompts if p.startswith("[")]
    assert len(tagged) == 4 * 3 + 3 + 2 and len({p.split("]")[0] for p in tagged}) == len(tagged)  # + both warm-ups
    assert point.to_json()["details"]["prefill_s_per_token"] == pytest.approx(PREFILL_S)


def test_a_request_of_any_shape_is_predicted_from_the_calibrated_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speed model's request time (core.speed.request_seconds) over the calibration's own figures gives the
    engine's wall time for prompts shorter and longer than calibration's chat turns and for answers shorter and
    longer than its: the step holds the chat turns' prefill and a share of the per-request overhead, and only
    the difference is added or taken away."""
    engine = FakeEngine(context_s=CONTEXT_S, overhead_s=0.3)
    [point] = _run(engine, monkeypatch)
    d = point.details
    cost = ContextCost(d["step_s_per_context_token"], d["context_tokens"], d["prompt_tokens"], d["overhead_s"],
                       d["max_tokens"] / d["tokens_per_step"])
    assert d["overhead_s"] == pytest.approx(0.3)
    for words, answer in ((40, 64), (130, 64), (400, 64), (130, 8), (130, 160)):
        before = engine.now
        asyncio.run(_chat(engine, " ".join(["mot"] * words), answer))
        predicted = request_seconds(TOKENS_PER_STEP, point.step_s, answer_tokens=answer,
                                    prompt_tokens=words + CHAT_TEMPLATE_TOKENS,
                                    prefill_s_per_token=d["prefill_s_per_token"], context=cost)
        assert predicted == pytest.approx(engine.now - before, rel=0.02), (words, answer)
    # without the overhead's share, the short answer is predicted far too fast
    bare = ContextCost(d["step_s_per_context_token"], d["context_tokens"], d["prompt_tokens"])
    before = engine.now
    asyncio.run(_chat(engine, " ".join(["mot"] * 130), 8))
    assert request_seconds(TOKENS_PER_STEP, point.step_s, answer_tokens=8, prompt_tokens=130 + CHAT_TEMPLATE_TOKENS,
                           prefill_s_per_token=d["prefill_s_per_token"], context=bare) < 0.8 * (engine.now - before)


async def _chat(engine: FakeEngine, text: str, max_tokens: int) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine.handle)) as client:
        await client.post("http://engine/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens})


def test_an_engine_that_reports_no_prompt_tokens_gets_no_prefill_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    [point] = _run(FakeEngine(report_prompt_tokens=False), monkeypatch, waves=2)
    assert "prefill_s_per_token" not in point.details and point.step_s > STEP_S


def test_the_step_s_growth_per_context_token_is_measured_with_the_context_it_was_measured_at(
        monkeypatch: pytest.MonkeyPatch) -> None:
    [point] = _run(FakeEngine(context_s=CONTEXT_S), monkeypatch)
    assert point.details["step_s_per_context_token"] == pytest.approx(CONTEXT_S)
    assert point.details["prefill_s_per_token"] == pytest.approx(PREFILL_S)
    # the step waves' mean context: their prompts' tokens and half of the 64-token answer
    assert point.details["context_tokens"] == pytest.approx(point.details["prompt_tokens"] + 32)


def test_an_engine_whose_step_ignores_the_context_gets_no_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    [point] = _run(FakeEngine(), monkeypatch)
    assert point.details["step_s_per_context_token"] == pytest.approx(0.0, abs=1e-12)


def test_the_calibrate_table_prints_prefill_and_the_step_s_growth_per_context_token(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from polyspec.engines import print_calibration

    [point] = _run(FakeEngine(context_s=CONTEXT_S), monkeypatch)
    out = Console(record=True, width=300)
    print_calibration([{"deployment": "m", "draft": "multi@1", "k": 4, "points": [point.to_json()]},
                       {"deployment": "gone", "draft": "none", "k": 0, "error": "unreachable"}], out)
    text = out.export_text()
    assert "prefill ms/prompt token" in text and "step ms/context token" in text
    row = next(line for line in text.splitlines() if "multi@1" in line)
    assert f"{PREFILL_S * 1000:.2f}" in row and f"{CONTEXT_S * 1000:.4f}" in row
    assert "unreachable" in text


def test_a_per_request_overhead_is_fitted_apart_from_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    [point] = _run(FakeEngine(overhead_s=0.3, context_s=CONTEXT_S), monkeypatch)
    d = point.details
    assert d["fit_requests"] == 3 + 4 * 3  # the step waves and every request of the pairs
    assert d["overhead_s"] == pytest.approx(0.3) and d["prefill_s_per_token"] == pytest.approx(PREFILL_S)
    assert d["step_s_per_context_token"] == pytest.approx(CONTEXT_S)
    assert d["decode_step_s"] == pytest.approx(STEP_S + CONTEXT_S * d["context_tokens"])  # at the waves' context
    # the stored step, wall time over steps as the router measures it live, still holds the overhead's share
    assert point.step_s >= d["decode_step_s"] + 0.3 / 32 - 1e-9


def test_a_batch_above_one_keeps_wall_time_over_steps_without_a_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine(overhead_s=0.3)
    monkeypatch.setattr(calibrate.time, "perf_counter", engine.clock)
    found = asyncio.run(calibrate.calibrate_engines({"e": ("http://engine", True)}, batches=[1, 2], waves=3,
                                                    max_tokens=64, transport=httpx.MockTransport(engine.handle)))
    one, two = found["e"]
    assert "overhead_s" in one.details and "overhead_s" not in two.details
