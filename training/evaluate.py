"""Evaluate a draft on MT-Bench prompts, offline (transformers) or through a real vLLM engine.

Both methods use the same chat prompts, greedy decoding and token budget, and report the same
`models.acceptance.AcceptanceResult` (histogram h[j] = spec steps that accepted exactly j drafts;
acceptance at position i = sum(h[i:]) / sum(h)). See docs/acceptance-methods.md for how closely
they agree.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.acceptance import AcceptanceResult, PromptAcceptance

if TYPE_CHECKING:
    import httpx

MTBENCH_DIR = Path(__file__).resolve().parent / "data" / "mtbench"


class EvaluationError(RuntimeError):
    """An evaluation could not run or produced inconsistent figures."""


class UnknownBenchmarkLanguage(EvaluationError, ValueError):
    """No bundled MT-Bench file for a requested language."""


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    language: str
    category: str
    turn: int
    text: str


def mtbench_languages() -> list[str]:
    return sorted(p.stem for p in MTBENCH_DIR.glob("*.jsonl"))


def _interleave(items: list[BenchPrompt]) -> list[BenchPrompt]:
    """Round-robin over categories so that a `limit` keeps the benchmark's mix (files are category-sorted)."""
    by_cat: dict[str, list[BenchPrompt]] = {}
    for item in items:
        by_cat.setdefault(item.category, []).append(item)
    out: list[BenchPrompt] = []
    queues = list(by_cat.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def load_mtbench(
    languages: Iterable[str],
    turns: Sequence[int] = (1,),
    categories: Iterable[str] | None = None,
    limit: int | None = None,
) -> dict[str, list[BenchPrompt]]:
    """Bundled MT-Bench questions per language. Each selected turn is sent as a one-turn chat.

    ``limit`` keeps the first N per language after interleaving categories.
    """
    wanted = set(categories) if categories is not None else None
    if any(t not in (1, 2) for t in turns):
        raise EvaluationError(f"MT-Bench has turns 1 and 2; got {list(turns)}")
    out: dict[str, list[BenchPrompt]] = {}
    for lang in languages:
        path = MTBENCH_DIR / f"{lang}.jsonl"
        if not path.is_file():
            raise UnknownBenchmarkLanguage(
                f"no MT-Bench prompts for language {lang!r}; available: {', '.join(mtbench_languages())}"
            )
        items = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if wanted is not None and rec.get("category") not in wanted:
                continue
            for t in turns:
                items.append(BenchPrompt(rec["id"], lang, rec.get("category") or "general", t, rec["turns"][t - 1]))
        items = _interleave(items)
        out[lang] = items[:limit] if limit is not None else items
        if not out[lang]:
            raise EvaluationError(f"no MT-Bench prompts left for {lang!r} after filtering by {sorted(wanted or [])}")
    return out


def evaluate_offline(
    draft_path: Any,
    verifier_path: Any,
    languages: Iterable[str],
    *,
    k: int = 3,
    max_new_tokens: int = 128,
    limit: int | None = None,
    categories: Iterable[str] | None = None,
    device: str | None = None,
    dtype: Any = None,
    progress: bool = True,
) -> dict[str, AcceptanceResult]:
    """Offline greedy speculative decoding (models.acceptance) on each language's MT-Bench turn 1."""
    import torch

    from models.acceptance import measure_acceptance_models
    from models.draft_build import load_draft
    from models.hidden import default_device, load_verifier_model

    prompts = load_mtbench(languages, categories=categories, limit=limit)
    device = device or default_device()
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    verifier, tokenizer = load_verifier_model(verifier_path, device=device, dtype=dtype)
    draft = load_draft(draft_path, verifier_path, device=device, dtype=next(verifier.parameters()).dtype)
    return {
        lang: measure_acceptance_models(
            verifier, tokenizer, draft, [p.text for p in items], k=k, max_new_tokens=max_new_tokens,
            progress=progress, desc=f"offline {lang}",
        )
        for lang, items in prompts.items()
    }


def _chat(client: httpx.Client, url: str, model: str, prompt: str, max_tokens: int) -> PromptAcceptance:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "return_token_ids": True,
    }
    resp = client.post(f"{url}/v1/chat/completions", json=body)
    if resp.status_code != 200:
        raise EvaluationError(f"engine answered {resp.status_code}: {resp.text[:300]}")
    data = resp.json()
    spec = (data.get("metrics") or {}).get("speculative_decoding")
    if spec is None:
        raise EvaluationError(
            "the engine returned no metrics.speculative_decoding: it needs a draft and "
            "--per-request-spec-decode-metrics summary"
        )
    choice = (data.get("choices") or [{}])[0]
    output_ids = choice.get("token_ids")
    if output_ids is None:  # an engine without return_token_ids: keep the count, not the ids
        output_ids = [-1] * int((data.get("usage") or {}).get("completion_tokens", 0))
    return PromptAcceptance(
        histogram=list(spec["acceptance_histogram"]),
        output_ids=list(output_ids),
        prompt_ids=list(data.get("prompt_token_ids") or []),
    )


def _served_model(client: httpx.Client, url: str) -> str:
    models = client.get(f"{url}/v1/models").json().get("data") or []
    if not models:
        raise EvaluationError(f"{url}/v1/models lists no model")
    return str(models[0]["id"])


def _counters(client: httpx.Client, url: str) -> Any:
    from models.vllm_engine import parse_spec_decode_counters

    return parse_spec_decode_counters(client.get(f"{url}/metrics").text)


def cross_check(result: AcceptanceResult, delta: Any) -> list[str]:
    """Differences between the per-request histograms and the engine's Prometheus counter deltas."""
    h = result.histogram
    want_pos = [sum(h[i + 1 :]) for i in range(result.k)]
    got_pos = (list(delta.accepted_per_pos) + [0] * result.k)[: result.k]
    problems = []
    if delta.num_drafts != result.num_spec_steps:
        problems.append(f"num_drafts {delta.num_drafts} != spec steps {result.num_spec_steps}")
    if delta.num_accepted_tokens != sum(j * c for j, c in enumerate(h)):
        problems.append(f"accepted tokens {delta.num_accepted_tokens} != {sum(j * c for j, c in enumerate(h))}")
    if got_pos != want_pos:
        problems.append(f"accepted per position {got_pos} != {want_pos}")
    return problems


def _measure_vllm(client: httpx.Client, url: str, model: str, prompts: list[str], max_tokens: int,
                  concurrency: int, exclusive: bool, lang: str) -> AcceptanceResult:
    from tqdm.auto import tqdm

    before = _counters(client, url)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = pool.map(lambda p: _chat(client, url, model, p, max_tokens), prompts)
        details = list(tqdm(futures, total=len(prompts), desc=f"vllm {lang}", unit="prompt"))
    hist = [sum(c) for c in zip(*(d.histogram for d in details), strict=True)]
    result = AcceptanceResult.from_histogram(
        hist, num_prompts=len(details), num_tokens=sum(len(d.output_ids) for d in details), details=details
    )
    problems = cross_check(result, _counters(client, url) - before)
    if problems and exclusive:
        raise EvaluationError(f"per-request metrics disagree with the engine counters ({lang}): {'; '.join(problems)}")
    if problems:  # a shared engine also counts other clients' traffic
        warnings.warn(f"engine counters moved by other traffic ({lang}): {'; '.join(problems)}", stacklevel=2)
    return result


def evaluate_vllm(
    draft_path: Any,
    verifier_path: Any,
    languages: Iterable[str],
    *,
    k: int = 3,
    max_new_tokens: int = 128,
    limit: int | None = None,
    categories: Iterable[str] | None = None,
    engine_url: str | None = None,
    concurrency: int = 1,
    log_path: str | Path | None = None,
    start_timeout: float = 900,
) -> dict[str, AcceptanceResult]:
    """The same prompts through a vLLM engine serving the draft (started here unless ``engine_url``)."""
    import httpx

    from models.vllm_engine import EngineSpec, VllmEngine

    prompts = load_mtbench(languages, categories=categories, limit=limit)
    engine = None
    if engine_url is None:
        verifier_dir = Path(getattr(verifier_path, "path", verifier_path))
        log = Path(log_path) if log_path else Path(draft_path).parent / f".{Path(draft_path).name}.vllm.log"
        engine = VllmEngine(EngineSpec(verifier=verifier_dir, draft=Path(draft_path), k=k), log)
        engine.start()
    try:
        if engine is not None:
            engine.wait_ready(timeout=start_timeout)
        url = engine.url if engine is not None else engine_url.rstrip("/")
        with httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0)) as client:
            model = _served_model(client, url)
            return {
                lang: _measure_vllm(client, url, model, [p.text for p in items], max_new_tokens,
                                    concurrency, exclusive=engine is not None, lang=lang)
                for lang, items in prompts.items()
            }
    finally:
        if engine is not None:
            engine.stop()


def evaluation_rows(
    results: dict[str, AcceptanceResult], *, method: str, benchmark: str = "mtbench", domain: str = "general"
) -> list[dict[str, Any]]:
    """Rows for `registry.Registry.add_evaluation(draft, **row)`."""
    return [
        {
            "benchmark": benchmark,
            "language": lang,
            "domain": domain,
            "k": r.k,
            "acceptance": list(r.acceptance),
            "mean_acceptance_length": r.mean_acceptance_length,
            "num_prompts": r.num_prompts,
            "num_tokens": r.num_tokens,
            "method": method,
            "details": {"histogram": list(r.histogram), "num_spec_steps": r.num_spec_steps},
        }
        for lang, r in sorted(results.items())
    ]


def results_table(results: dict[str, AcceptanceResult], title: str = "acceptance") -> Any:
    """A rich table: one row per language, acceptance per position and mean acceptance length."""
    from rich.table import Table

    k = max((r.k for r in results.values()), default=0)
    table = Table(title=title)
    for col in ["lang", *[f"pos {i}" for i in range(1, k + 1)], "mean acc. len", "prompts", "tokens", "steps"]:
        table.add_column(col, justify="right" if col != "lang" else "left")
    for lang, r in sorted(results.items()):
        table.add_row(lang, *[f"{a:.3f}" for a in r.acceptance], f"{r.mean_acceptance_length:.3f}",
                      str(r.num_prompts), str(r.num_tokens), str(r.num_spec_steps))
    return table
