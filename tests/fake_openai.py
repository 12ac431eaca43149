"""A fast OpenAI-compatible benchmark backend (a test double: it isolates the routers' own cost).

Answers /v1/chat/completions and /v1/completions with a fixed-length answer, non-streamed or streamed
(one SSE chunk per token), carrying vLLM's ``metrics.speculative_decoding`` object the way a vLLM engine
started with ``--per-request-spec-decode-metrics summary`` does (in the final usage chunk of streams
when ``stream_options.include_usage`` is set). Also /health, /v1/models and an empty /metrics.
A plain ASGI app (no framework) so that the backend is never the bottleneck.

    python bench/fake_openai.py --port 9100 [--tokens 16] [--token-delay-ms 0]   # as a process, for the benchmarks
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from polyspec.core.acceptance import mal_from_histogram

MODEL = "fake-engine"


def _spec_metrics(tokens: int) -> dict[str, Any]:
    steps = max(1, tokens // 2)
    hist = [0, steps, 0, 0]  # every step accepts exactly one draft
    return {"mean_acceptance_length": round(mal_from_histogram(hist), 3), "acceptance_histogram": hist,
            "num_spec_steps": steps, "num_draft_tokens": 3 * steps, "num_accepted_draft_tokens": steps}


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": 32, "completion_tokens": tokens, "total_tokens": 32 + tokens}


def _full(kind: str, tokens: int, created: int) -> dict[str, Any]:
    text = "tok " * tokens
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": "cmpl-bench", "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created, "model": MODEL, "choices": [choice], "usage": _usage(tokens),
            "metrics": {"speculative_decoding": _spec_metrics(tokens)}}


def _chunk(kind: str, created: int, i: int | None, last: bool = False) -> bytes:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    if i is None:
        choices: list[Any] = []
    elif kind == "chat":
        choices = [{"index": 0, "delta": {"content": "tok "}, "finish_reason": "length" if last else None}]
    else:
        choices = [{"index": 0, "text": "tok ", "finish_reason": "length" if last else None}]
    body: dict[str, Any] = {"id": "cmpl-bench", "object": obj, "created": created, "model": MODEL, "choices": choices}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class FakeOpenAI:
    def __init__(self, tokens: int = 16, token_delay_s: float = 0.0) -> None:
        self.tokens = tokens
        self.token_delay_s = token_delay_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path in ("/v1/chat/completions", "/v1/completions") and scope["method"] == "POST":
            body = b""
            while True:
                msg = await receive()
                body += msg.get("body", b"")
                if not msg.get("more_body"):
                    break
            await self._complete("chat" if "chat" in path else "completions", json.loads(body or b"{}"), send)
        elif path == "/health":
            await self._json(send, 200, {})
        elif path == "/v1/models":
            await self._json(send, 200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]})
        elif path == "/metrics":
            await self._send(send, 200, b"", b"text/plain")
        else:
            await self._json(send, 404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    async def _complete(self, kind: str, req: dict[str, Any], send: Any) -> None:
        tokens = min(int(req.get("max_tokens") or self.tokens), self.tokens)
        created = int(time.time())
        if not req.get("stream"):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s * tokens)
            await self._json(send, 200, _full(kind, tokens, created))
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        for i in range(tokens):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            await send({"type": "http.response.body", "body": _chunk(kind, created, i, i == tokens - 1),
                        "more_body": True})
        options = req.get("stream_options") or {}
        if options.get("include_usage"):
            usage = json.loads(_chunk(kind, created, None)[6:])
            usage.update(usage=_usage(tokens), metrics={"speculative_decoding": _spec_metrics(tokens)})
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(usage).encode() + b"\n\n",
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def _json(self, send: Any, status: int, obj: Any) -> None:
        await self._send(send, status, json.dumps(obj).encode(), b"application/json")

    async def _send(self, send: Any, status: int, body: bytes, ctype: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def main() -> None:
    import argparse

    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--token-delay-ms", type=float, default=0.0)
    a = p.parse_args()
    if a.host not in ("127.0.0.1", "localhost"):
        raise SystemExit("the benchmark backend only listens on 127.0.0.1")
    uvicorn.run(FakeOpenAI(a.tokens, a.token_delay_ms / 1000), host=a.host, port=a.port, log_level="warning",
                access_log=False, backlog=4096)


if __name__ == "__main__":
    main()
