"""Engine calibration: measure an engine's step cost at several batch sizes, for the speed model (core.speed).

For each batch size b, ``waves`` rounds of b concurrent chat requests, each generating exactly ``max_tokens``
tokens (``ignore_eos``) from a chat turn of the length traffic has (``CHAT_PROMPTS``: eight languages, about 140
prompt tokens with SmolLM2's template), each opened by a fresh tag so that no prefix cache serves its prompt. A
request's step time is its wall time over its steps: vLLM's per-request ``num_spec_steps`` with a draft, its
tokens without one. The point stored for b is the median over the requests (the prompt's prefill and the chat
request's own costs included: the figure is what a client sees, the same quantity the router measures live), and
``prompt_tokens`` in its details is the mean prompt those steps hold. One warm-up request first, so that no compile
or cache fill lands in a measurement.
Several engines are measured in turns, wave by wave (``calibrate_engines``), not one after another.

Prefill is measured apart (``prefill_s_per_token`` in every point's details): after the step waves, ``waves``
pairs of one-token completions, a short prompt and a long one, each opened by a fresh tag so that no prefix
cache serves it; the figure is the median over the pairs of their time difference over their prompt-token
difference. A chat request's prompt runs to hundreds of tokens and its prefill is a tenth of its time or
more (docs/speed.md, "Prefill"); the speed model adds it for a prompt's tokens beyond the step waves'
``prompt_tokens`` (core.speed.request_seconds). Each pair also runs the two
prompts to ``max_tokens`` (fresh tags again): their decode seconds per step (the full completion less the
one-token one) differ by the context's cost, and the median over the pairs of that difference over the prompt-token
difference is ``step_s_per_context_token``, the step's growth per token of context (attention over a longer
context). ``context_tokens`` is the step waves' mean context (prompt tokens plus half the answer), the length
their step time holds.

At batch 1, every request of the step waves and of the pairs also enters one least-squares fit
(core.speed.fit_request_cost): wall time on a per-request overhead, prompt tokens, steps and steps times the
context. Its prefill and growth replace the pairs' medians (``prefill_s_per_token``, ``step_s_per_context_token``;
the medians stay as ``..._pairs``): a median of differences of a few noisy requests came out 0-3 ms per prompt
token on a loaded 2-core machine, where chat requests cost 3.5 (docs/speed.md). ``overhead_s`` and
``decode_step_s`` are stored beside them and read by no model (docs/speed.md says why). The warm-up runs a
full-length answer and the long prompt.

Acceptance does not matter here: the speed model takes tokens per step from the acceptance figures, and
the step time of an engine hardly depends on how many drafts the verifier accepts.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from polyspec.core.errors import Unavailable
from polyspec.core.speed import Sample, fit_request_cost

PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator keeps food cold, step by step.",
    "List ten ideas for a weekend trip and say what each one costs.",
    "Describe the water cycle to a ten-year-old.",
)
MAX_BATCH = 256
# Chat turns for the step waves: traffic's length (78-226 tokens per MT-Bench first turn with the chat template, mean
# about 130), so that the calibrated step holds the prefill and chat costs a served request pays. Written for this
# file; the fleet bench sends none of them.
CHAT_PROMPTS = (
    "I am planning a two-week trip through northern Italy by train in late spring. I would like to see Milan, "
    "Lake Como, Verona, Venice and Bologna, and I enjoy food markets, small museums and walks rather than big "
    "tourist sights. Suggest an itinerary with how many nights to spend in each place, the train connections "
    "between them, and one thing to eat in every city.",
    "Je dois présenter à mon équipe les résultats d'un projet qui a pris du retard. Le budget a été respecté, "
    "mais deux fonctionnalités importantes sont reportées au trimestre prochain. Peux-tu m'aider à rédiger un "
    "court message honnête et positif qui explique la situation, ce que nous avons appris et le nouveau calendrier ?",
    "Erkläre mir bitte, wie eine Wärmepumpe im Winter ein Haus heizen kann, obwohl es draußen kälter ist als "
    "drinnen. Ich habe kein technisches Vorwissen. Gehe auf den Kältemittelkreislauf ein, sage, wann sich eine "
    "Wärmepumpe lohnt, und nenne zwei typische Fehler bei der Planung.",
    "Mi hermana empieza la universidad en otoño y quiere aprender a organizar su tiempo y su dinero. Escribe una "
    "lista de diez consejos prácticos, cada uno con una frase de explicación, sobre el estudio, el presupuesto "
    "mensual, el descanso y cómo pedir ayuda cuando algo va mal.",
    "Sto scrivendo un racconto breve ambientato in un piccolo paese di montagna durante una nevicata che isola "
    "tutti per tre giorni. Proponimi tre idee di trama diverse, ciascuna con un personaggio principale, un "
    "conflitto e un finale inaspettato, in poche righe per idea.",
    "Quero começar a correr três vezes por semana, mas nunca pratiquei desporto com regularidade e tenho algum "
    "excesso de peso. Faz-me um plano de oito semanas para conseguir correr trinta minutos seguidos, com "
    "conselhos sobre calçado, aquecimento e como evitar lesões.",
    "Объясни, пожалуйста, простыми словами, как работает банковский вклад и чем он отличается от "
    "инвестиций в облигации. Приведи пример с суммой в сто тысяч рублей на один год.",
    "来月、友人の結婚式でスピーチをすることになりました。新郎とは大学時代からの友人です。"
    "三分ほどの温かくてユーモアのあるスピーチの構成を考えてください。",
)
LONG_PROMPT = " ".join(PROMPTS * 6)  # about 360 tokens: a long chat turn, far enough from the short one that
# the prefill it adds (about a second on 2 CPU cores) stands above a request's noise


class CalibrationFailed(Unavailable):
    """An engine could not be calibrated (unreachable, or answers without what the measurement needs)."""


@dataclass
class Point:
    batch_size: int
    step_s: float
    tokens_per_s: float
    requests: int
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "step_s": self.step_s, "tokens_per_s": self.tokens_per_s,
                "requests": self.requests, "details": self.details}


def parse_batches(text: str) -> list[int]:
    """"1,2,4" -> [1, 2, 4]; each between 1 and MAX_BATCH, no repeats."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"batch sizes must be integers separated by commas, not {text!r}") from None
    if not values or any(not 1 <= v <= MAX_BATCH for v in values) or len(set(values)) != len(values):
        raise ValueError(f"batch sizes must be distinct integers from 1 to {MAX_BATCH}, not {text!r}")
    return sorted(values)


async def _model_id(client: httpx.AsyncClient, url: str) -> str:
    resp = await client.get(f"{url}/v1/models")
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data or not isinstance(data[0], dict) or not isinstance(data[0].get("id"), str):
        raise CalibrationFailed(f"{url}/v1/models lists no model")
    return data[0]["id"]


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
               speculates: bool) -> tuple[float, int, int]:
    """(wall seconds, steps, completion tokens) of one completion."""
    wall, steps, tokens, _ = await _completion(client, url, model, prompt, max_tokens, speculates)
    return wall, steps, tokens


async def _completion(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
                      speculates: bool, chat: bool = False) -> tuple[float, int, int, int]:
    """(wall seconds, steps, completion tokens, prompt tokens) of one completion, or with ``chat`` of one chat
    request whose user turn is ``prompt``."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    started = time.perf_counter()
    resp = await client.post(f"{url}/v1/chat/completions" if chat else f"{url}/v1/completions", json=body)
    wall = time.perf_counter() - started
    if resp.status_code != 200:
        raise CalibrationFailed(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        data = resp.json()
        tokens = int(data["usage"]["completion_tokens"])
        prompt_tokens = int(data["usage"].get("prompt_tokens") or 0)
        spec = (data.get("metrics") or {}).get("speculative_decoding") or {}
    except (ValueError, KeyError, TypeError) as exc:
        raise CalibrationFailed(f"{url} answered a completion without usage ({type(exc).__name__})") from None
    steps = int(spec.get("num_spec_steps") or 0) if speculates else tokens
    if speculates and steps <= 0 and max_tokens > 1:
        raise CalibrationFailed(f"{url} reports no speculative steps: is it started with a draft and "
                                "--per-request-spec-decode-metrics summary?")
    return wall, steps, tokens, prompt_tokens


async def _prefill(client: httpx.AsyncClient, url: str, model: str, speculates: bool, max_tokens: int = 0,
                   seen: list[Sample] | None = None) -> tuple[float | None, float | None]:
    """(seconds per prompt token, step seconds per context token) of one pair of prompts, a short and a long one;
    each request's (wall, steps, prompt tokens, tokens) is added to ``seen``.
    Prefill: a one-token completion of the long prompt less one of the short prompt, over their prompt-token
    difference. Context: with ``max_tokens`` > 1, each prompt also runs to ``max_tokens``; its decode seconds per
    step are that completion less the one-token one, over its steps, and the long prompt's less the short one's,
    over the prompt-token difference, is the context figure. Every request opens with a fresh tag so no prefix
    cache serves it. None where the engine reports no prompt tokens or the long prompt was not the longer one."""
    tag = uuid.uuid4().hex[:8]
    seen = seen if seen is not None else []
    short = await _completion(client, url, model, f"[{tag}] {PROMPTS[0]}", 1, speculates)
    long = await _completion(client, url, model, f"[{tag}-long] {LONG_PROMPT}", 1, speculates)
    seen += [short, long]
    extra = long[3] - short[3]
    if extra <= 0:
        return None, None
    prefill = max(0.0, long[0] - short[0]) / extra
    if max_tokens <= 1:
        return prefill, None
    decode = []
    for one, text in ((short, f"[{tag}-s] {PROMPTS[0]}"), (long, f"[{tag}-l] {LONG_PROMPT}")):
        full = await _completion(client, url, model, text, max_tokens, speculates)
        seen.append(full)
        decode.append(max(0.0, full[0] - one[0]) / max(1, full[1]))
    return prefill, max(0.0, decode[1] - decode[0]) / extra


async def calibrate_engines(engines: Mapping[str, tuple[str, bool]], *, batches: Sequence[int], waves: int = 2,
                            max_tokens: int = 64, timeout_s: float = 600.0,
                            progress: Callable[[str, int], None] | None = None,
                            transport: httpx.AsyncBaseTransport | None = None,
                            ) -> dict[str, list[Point] | CalibrationFailed]:
    """The step-cost curves of several engines (name -> (url, speculates)), measured in turns: each wave of
    each batch size goes to every engine before the next wave, in an order that turns per wave. Whatever
    changes on the machine while it runs (other work, caches, memory) then falls on every engine alike. It
    does not remove the noise of the few requests behind each point: engines of one shape still calibrated
    far apart on a shared 2-core machine (docs/speed.md, Figures). An engine that fails is reported as its
    CalibrationFailed; the others go on.
    ``progress(name, n)`` is told of each n requests done on an engine; ``transport`` replaces the network
    (tests)."""
    widest = max(batches) + 1
    limits = httpx.Limits(max_connections=widest * max(1, len(engines)), max_keepalive_connections=widest * len(engines))
    failed: dict[str, CalibrationFailed] = {}
    models: dict[str, str] = {}
    samples: dict[str, dict[int, list[tuple[float, int, int, int]]]] = {}
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, transport=transport) as client:
        urls = {name: url.rstrip("/") for name, (url, _) in engines.items()}
        for name, (_, speculates) in engines.items():
            try:
                models[name] = await _model_id(client, urls[name])
                # warm-up, not measured: a full-length answer and a long prompt, so that no first-time cost of
                # either lands in a measured request
                await _completion(client, urls[name], models[name], f"[{uuid.uuid4().hex[:8]}] {CHAT_PROMPTS[0]}",
                                  max_tokens, speculates, chat=True)
                await _one(client, urls[name], models[name], f"[{uuid.uuid4().hex[:8]}] {LONG_PROMPT}", 8, speculates)
            except (CalibrationFailed, httpx.HTTPError, ValueError) as exc:
                failed[name] = _failure(urls[name], exc)
            samples[name] = {batch: [] for batch in batches}
        turn = 0
        for batch in batches:
            for _ in range(waves):
                alive = [name for name in engines if name not in failed]
                shift = turn % len(alive) if alive else 0
                turn += 1
                for name in alive[shift:] + alive[:shift]:
                    first = (turn - 1) * batch  # every engine gets the same turns in a wave
                    runs = [_completion(client, urls[name], models[name],
                                        f"[{uuid.uuid4().hex[:8]}] {CHAT_PROMPTS[(first + i) % len(CHAT_PROMPTS)]}",
                                        max_tokens, engines[name][1], chat=True) for i in range(batch)]
                    try:
                        samples[name][batch] += await asyncio.gather(*runs)
                    except (CalibrationFailed, httpx.HTTPError) as exc:
                        failed[name] = _failure(urls[name], exc)
                        continue
                    if progress is not None:
                        progress(name, batch)
        prefill: dict[str, list[float]] = {name: [] for name in engines}
        context: dict[str, list[float]] = {name: [] for name in engines}
        pairs: dict[str, list[Sample]] = {name: [] for name in engines}
        for _ in range(waves):  # in turns as well, for the same reason
            for name in [n for n in engines if n not in failed]:
                try:
                    per_token, per_context = await _prefill(client, urls[name], models[name], engines[name][1],
                                                            max_tokens, pairs[name])
                except (CalibrationFailed, httpx.HTTPError) as exc:
                    failed[name] = _failure(urls[name], exc)
                    continue
                if per_token is not None:
                    prefill[name].append(per_token)
                if per_context is not None:
                    context[name].append(per_context)
    return {name: failed.get(name) or [_point(b, samples[name][b], max_tokens, prefill[name], context[name],
                                              pairs[name] if b == 1 else ())
                                       for b in batches] for name in engines}


def _failure(url: str, exc: Exception) -> CalibrationFailed:
    """What an engine's failure is reported as: its own CalibrationFailed, or one naming the URL and error."""
    return exc if isinstance(exc, CalibrationFailed) else CalibrationFailed(f"{url}: {type(exc).__name__}: {exc}")


def _point(batch: int, samples: list[tuple[float, int, int, int]], max_tokens: int, prefill: Sequence[float] = (),
           context: Sequence[float] = (), pairs: Sequence[Sample] = ()) -> Point:
    steps = [wall / max(1, n) for wall, n, _, _ in samples]
    tps = [tokens / wall for wall, _, tokens, _ in samples if wall > 0]
    details: dict[str, Any] = {
        "step_s_min": min(steps), "step_s_max": max(steps), "max_tokens": max_tokens,
        "tokens_per_step": sum(t for _, _, t, _ in samples) / max(1, sum(n for _, n, _, _ in samples)),
        "prompt_tokens": statistics.mean(p for *_, p in samples),
        "context_tokens": statistics.mean(p for *_, p in samples) + max_tokens / 2}
    if prefill:  # the engine's, not the batch's: measured one request at a time
        details["prefill_s_per_token"] = statistics.median(prefill)
    if context:
        details["step_s_per_context_token"] = statistics.median(context)
    # Batch 1 with the pairs: every request of the point and of the pairs in one least-squares fit (the medians
    # above are its fallback): the prefill and growth the planner reads, and the overhead and decode step besides.
    if pairs and (fit := fit_request_cost([*samples, *pairs], details["context_tokens"])) is not None:
        details.update({f"{key}_pairs": details[key] for key in ("prefill_s_per_token", "step_s_per_context_token")
                        if key in details})  # the medians, kept beside the fit to compare
        details.update(overhead_s=fit.overhead_s, prefill_s_per_token=fit.prefill_s_per_token,
                       decode_step_s=fit.step_s, step_s_per_context_token=fit.context.s_per_token,
                       fit_requests=fit.requests)
    return Point(batch, statistics.median(steps), statistics.median(tps), len(samples), details)
