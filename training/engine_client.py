"""Verifier answers from a running vLLM engine (httpx async, bounded concurrency, retries with backoff).

The prompt is templated and tokenized here with the verifier's own tokenizer and sent as token ids to
``/v1/completions`` with ``return_token_ids: true``; the answer token ids come back in
``choices[0].token_ids`` (vLLM >= 0.10.2), so no text round trip can change the ids the draft trains on.
Engines without that field get the returned text tokenized instead (plus the end-of-turn token when
``finish_reason == "stop"``).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import httpx
from rich.progress import Progress

from polyspec.training.answers import AnswerWriter, _drop_long, cut_answer, eos_ids, make_row, template_prompt
from polyspec.training.config import AnswersConfig
from polyspec.training.errors import EngineError
from polyspec.training.runs import console

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


async def _model_id(client: Any, url: str) -> str:
    try:
        resp = await client.get(f"{url}/v1/models")
        resp.raise_for_status()
        return resp.json()["data"][0]["id"]
    except Exception as exc:  # noqa: BLE001 - any failure here means "not a usable engine"
        raise EngineError(f"vLLM engine at {url} did not list its model: {exc}") from None


async def _complete(client: Any, url: str, body: dict[str, Any], cfg: AnswersConfig) -> dict[str, Any]:
    delay = cfg.backoff_s
    for attempt in range(cfg.retries + 1):
        try:
            resp = await client.post(f"{url}/v1/completions", json=body)
            if resp.status_code not in _RETRY_STATUS:
                resp.raise_for_status()
                return resp.json()["choices"][0]
            problem = f"HTTP {resp.status_code}"
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        except httpx.HTTPStatusError as exc:
            raise EngineError(f"engine refused a request: HTTP {exc.response.status_code} {exc.response.text[:200]}") from None
        if attempt == cfg.retries:
            raise EngineError(f"engine at {url} failed {cfg.retries + 1} times; last error: {problem}")
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, cfg.max_backoff_s)
    raise AssertionError("unreachable")


def _answer_ids(choice: dict[str, Any], tokenizer: Any, eos: set[int]) -> tuple[list[int], bool]:
    ids = choice.get("token_ids")
    if ids is None:  # older engines: tokenize the text, restore the end-of-turn token vLLM strips
        ids = list(tokenizer(choice.get("text", ""), add_special_tokens=False).input_ids)
        if choice.get("finish_reason") == "stop" and eos:
            ids.append(min(eos))
    return cut_answer(ids, eos)


async def _run(records: list[dict[str, Any]], tokenizer: Any, cfg: AnswersConfig, writer: AnswerWriter,
               transport: Any = None) -> None:
    url = (cfg.engine_url or "").rstrip("/").removesuffix("/v1")
    eos = eos_ids(tokenizer)
    templated = _drop_long([(r, template_prompt(tokenizer, r["messages"])) for r in records], cfg.max_prompt_tokens)
    limits = httpx.Limits(max_connections=cfg.concurrency)
    async with httpx.AsyncClient(timeout=cfg.request_timeout_s, limits=limits, transport=transport) as client:
        model = await _model_id(client, url)
        gate = asyncio.Semaphore(cfg.concurrency)

        async def one(rec: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any]:
            body = {
                "model": model, "prompt": prompt_ids, "max_tokens": cfg.max_new_tokens,
                "temperature": cfg.temperature, "return_token_ids": True, "skip_special_tokens": False,
            }
            async with gate:
                choice = await _complete(client, url, body, cfg)
            answer, finished = _answer_ids(choice, tokenizer, eos)
            return make_row(rec, prompt_ids, answer, finished, tokenizer.decode(answer, skip_special_tokens=True))

        with Progress(console=console) as progress:
            task = progress.add_task(f"answers from {url}", total=len(templated))
            for fut in asyncio.as_completed([one(r, p) for r, p in templated]):
                writer.write([await fut])
                progress.advance(task)


def answer_with_engine(records: list[dict[str, Any]], verifier_path: Path, cfg: AnswersConfig, writer: AnswerWriter,
                       transport: Any = None) -> None:
    """``transport`` (an httpx transport) exists for fault-injection tests."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(verifier_path))
    console.print(f"asking the vLLM engine at {cfg.engine_url} ({cfg.concurrency} in flight)")
    asyncio.run(_run(records, tokenizer, cfg, writer, transport))
