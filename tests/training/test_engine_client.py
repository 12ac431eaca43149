"""Answers from an engine: token ids come from the response; HTTP 5xx and dropped connections are
retried with backoff; an engine that keeps failing ends the stage with EngineError.

The engine here is an httpx MockTransport that injects faults (500s, dropped connections) in front of
canned completions — a fault-injection double only; the real vLLM path is what the router tests run.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from polyspec.training.answers import AnswerWriter
from polyspec.training.config import AnswersConfig
from polyspec.training.engine_client import answer_with_engine
from polyspec.training.errors import EngineError

RECORDS = [{"id": f"p{i}", "lang": "fr", "domain": "general", "messages": [{"role": "user", "content": f"Question {i} ?"}]}
           for i in range(3)]


def _faulty_engine(faults: list[str]):
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "smollm2"}]})
        body = json.loads(request.content)
        seen.append(body)
        fault = faults.pop(0) if faults else "ok"
        if fault == "500":
            return httpx.Response(500, text="engine overloaded")
        if fault == "drop":
            raise httpx.RemoteProtocolError("server disconnected", request=request)
        n = len(body["prompt"]) % 7
        return httpx.Response(200, json={"choices": [{"token_ids": [100 + n, 200, 2, 999], "text": "x",
                                                      "finish_reason": "stop"}]})

    return httpx.MockTransport(handler), seen


def test_engine_answers_use_returned_token_ids_and_retry(verifier, tmp_path: Path) -> None:
    transport, seen = _faulty_engine(["500", "drop", "500"])
    cfg = AnswersConfig(engine_url="http://engine:8000/v1", retries=4, backoff_s=0.01, concurrency=2)
    writer = AnswerWriter(tmp_path / "answers.jsonl")
    answer_with_engine(RECORDS, verifier.path, cfg, writer, transport=transport)
    writer.close()
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "answers.jsonl").read_text().splitlines())}
    assert set(rows) == {"p0", "p1", "p2"} and len(seen) == 6  # three faults retried
    for row in rows.values():
        prompt_len = row["num_prompt_tokens"]
        answer = row["input_ids"][prompt_len:]
        assert answer[1:] == [200, 2] and row["finished"]  # 999 after <|im_end|> (id 2) is cut off
        assert row["loss_mask"] == [0] * prompt_len + [1, 1, 1]
    assert all(isinstance(b["prompt"], list) and b["return_token_ids"] for b in seen)


def test_engine_that_keeps_failing_raises(verifier, tmp_path: Path) -> None:
    transport, _ = _faulty_engine(["500"] * 10)
    cfg = AnswersConfig(engine_url="http://engine:8000", retries=2, backoff_s=0.01, concurrency=1)
    writer = AnswerWriter(tmp_path / "answers.jsonl")
    with pytest.raises(EngineError, match="failed 3 times; last error: HTTP 500"):
        answer_with_engine(RECORDS[:1], verifier.path, cfg, writer, transport=transport)
    writer.close()
