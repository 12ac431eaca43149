"""Evaluate drafts on benchmark conversations through real vLLM engines (the ``vllm`` method of
`polyspec eval`), and the per-language wrappers the training pipeline and tests use for both methods.

Both methods use the same chat conversations, greedy decoding and token budget, and report the same
`models.acceptance.AcceptanceResult` (histogram h[j] = spec steps that accepted exactly j drafts; the
arithmetic is core.acceptance's). See docs/acceptance-methods.md for how closely they agree.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from rich.table import Table

from polyspec.models.acceptance import AcceptanceResult, PromptAcceptance
from polyspec.core.settings import get_settings
from polyspec.models.verifiers import resolve_verifier
from polyspec.models.vllm_engine import EngineSpec, VllmEngine, parse_spec_decode_counters
from polyspec.training.benchmarks import (  # noqa: F401 - load_mtbench and friends are this module's API too
    BenchPrompt, UnknownBenchmarkLanguage, load_benchmark, load_mtbench, mtbench_languages,
)
from polyspec.training.eval_offline import score_offline
from polyspec.training.eval_options import DraftChoice, EvalError, EvalOptionError, EvalOptions, conversations

if TYPE_CHECKING:
    import httpx


class EvaluationError(EvalError):
    """An evaluation could not run or produced inconsistent figures."""


def verifier_info(verifier_path: Any) -> Any:
    """A VerifierInfo from a VerifierInfo, a directory or an alias."""
    if hasattr(verifier_path, "path") and hasattr(verifier_path, "name"):
        return verifier_path

    return resolve_verifier(str(verifier_path))


def _per_language(items_by_lang: dict[str, list[BenchPrompt]], scored_fn: Any, k: int) -> dict[str, AcceptanceResult]:
    flat = [(lang, it) for lang, items in items_by_lang.items() for it in items]
    scored, _ = scored_fn([it for _, it in flat])
    out: dict[str, list[PromptAcceptance]] = {lang: [] for lang in items_by_lang}
    for (lang, _), (_, per) in zip(flat, scored, strict=True):
        out[lang].append(per["draft"])
    return {lang: AcceptanceResult.of_details(details, k) for lang, details in out.items()}


def evaluate_offline(
    draft_path: Any,
    verifier_path: Any,
    languages: Iterable[str],
    *,
    k: int = 3,
    max_new_tokens: int = 128,
    limit: int | None = None,
    categories: Iterable[str] | None = None,
    turns: Sequence[int] = (1,),
    device: str | None = None,
    dtype: Any = None,
    progress: bool = True,
) -> dict[str, AcceptanceResult]:
    """Teacher-forced chain acceptance (batched; training.eval_offline) on each language's bundled MT-Bench."""
    prompts = load_mtbench(languages, turns=turns, categories=categories, limit=limit)
    dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else None
    options = EvalOptions(k=k, max_new_tokens=max_new_tokens, device=device, dtype=dtype_name, progress=progress)
    draft = DraftChoice(name="draft", path=Path(draft_path))
    verifier = verifier_info(verifier_path)
    return _per_language(prompts, lambda items: score_offline([draft], verifier, items, options), k)


def _chat(client: httpx.Client, url: str, model: str, messages: list[dict[str, str]],
          max_tokens: int) -> tuple[PromptAcceptance, str]:
    body = {
        "model": model,
        "messages": messages,
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
    detail = PromptAcceptance(
        histogram=list(spec["acceptance_histogram"]),
        output_ids=list(output_ids),
        prompt_ids=list(data.get("prompt_token_ids") or []),
    )
    return detail, str((choice.get("message") or {}).get("content") or "")


def _served_model(client: httpx.Client, url: str) -> str:
    models = client.get(f"{url}/v1/models").json().get("data") or []
    if not models:
        raise EvaluationError(f"{url}/v1/models lists no model")
    return str(models[0]["id"])


def _counters(client: httpx.Client, url: str) -> Any:
    return parse_spec_decode_counters(client.get(f"{url}/metrics").text)


def cross_check(result: AcceptanceResult, delta: Any) -> list[str]:
    """Differences between the per-request histograms and the engine's Prometheus counter deltas."""
    h = result.histogram
    accepted = [sum(h[i + 1 :]) for i in range(result.k)]  # steps that accepted position i+1
    tokens = sum(accepted)  # = sum(j * h[j])
    got_pos = (list(delta.accepted_per_pos) + [0] * result.k)[: result.k]
    problems = []
    if delta.num_drafts != result.num_spec_steps:
        problems.append(f"num_drafts {delta.num_drafts} != spec steps {result.num_spec_steps}")
    if delta.num_accepted_tokens != tokens:
        problems.append(f"accepted tokens {delta.num_accepted_tokens} != {tokens}")
    if got_pos != accepted:
        problems.append(f"accepted per position {got_pos} != {accepted}")
    return problems


def _vllm_round(client: httpx.Client, url: str, model: str, convs: list[list[dict[str, str]]], options: EvalOptions,
                exclusive: bool, label: str) -> list[tuple[PromptAcceptance, str]]:
    """One round of conversations through the engine, checked against its Prometheus counters."""
    from tqdm.auto import tqdm

    before = _counters(client, url)
    with ThreadPoolExecutor(max_workers=max(1, options.concurrency)) as pool:
        futures = pool.map(lambda c: _chat(client, url, model, c, options.max_new_tokens), convs)
        out = list(tqdm(futures, total=len(convs), desc=f"vllm {label}", unit="prompt", disable=not options.progress))
    result = AcceptanceResult.of_details([d for d, _ in out], options.k)
    problems = cross_check(result, _counters(client, url) - before)
    if problems and exclusive:
        raise EvaluationError(f"per-request metrics disagree with the engine counters ({label}): {'; '.join(problems)}")
    if problems:  # a shared engine also counts other clients' traffic
        warnings.warn(f"engine counters moved by other traffic ({label}): {'; '.join(problems)}", stacklevel=2)
    return out


def _score_one_engine(draft: DraftChoice, verifier: Any, items: Sequence[BenchPrompt], options: EvalOptions,
                      ) -> list[tuple[list[int], PromptAcceptance]]:
    engine = None
    if options.engine_url is None:
        # Under POLYSPEC_HOME, never beside the draft: that may be the checkout (models/drafts) or read-only.
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in draft.name)[:100]
        log = get_settings().home / "logs" / f"eval-{safe}.vllm.log"
        engine = VllmEngine(EngineSpec(verifier=Path(verifier.path), draft=draft.path, k=options.k), log)
        engine.start()
    try:
        if engine is not None:
            engine.wait_ready(timeout=900)
        url = engine.url if engine is not None else str(options.engine_url).rstrip("/")
        rounds: list[list[tuple[PromptAcceptance, str]]] = []
        with httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0)) as client:
            model = _served_model(client, url)

            def answer_round(convs: list[list[dict[str, str]]]) -> list[str]:
                rounds.append(_vllm_round(client, url, model, convs, options, engine is not None,
                                          f"{draft.name} turn {len(rounds) + 1}"))
                return [text for _, text in rounds[-1]]

            where = conversations(items, answer_round)
    finally:
        if engine is not None:
            engine.stop()
    picked = [rounds[r - 1][i][0] for r, i in (where[(it.id, it.turn)] for it in items)]
    return [([t for t in d.output_ids if t >= 0], d) for d in picked]


def score_vllm(drafts: Sequence[DraftChoice], verifier: Any, items: Sequence[BenchPrompt],
               options: EvalOptions) -> tuple[list[tuple[list[int], dict[str, PromptAcceptance]]], dict[str, float]]:
    """Per item: (the first engine's answer ids, draft name -> histogram); one engine per draft, one at a time."""
    if options.engine_url is not None and len(drafts) != 1:
        raise EvalOptionError("--engine-url serves one draft: give exactly one")
    out: list[tuple[list[int], dict[str, PromptAcceptance]]] = [([], {}) for _ in items]
    seconds: dict[str, float] = {}
    for n, d in enumerate(drafts):
        t0 = time.time()
        for row, (ids, detail) in zip(out, _score_one_engine(d, verifier, items, options), strict=True):
            if n == 0:  # the degenerate verdict comes from one answer per item, the same for every draft
                row[0].extend(ids)
            row[1][d.name] = detail
        seconds[f"draft {d.name}"] = round(time.time() - t0, 1)
    return out, seconds


def evaluate_vllm(
    draft_path: Any,
    verifier_path: Any,
    languages: Iterable[str],
    *,
    k: int = 3,
    max_new_tokens: int = 128,
    limit: int | None = None,
    categories: Iterable[str] | None = None,
    turns: Sequence[int] = (1,),
    engine_url: str | None = None,
    concurrency: int = 1,
    log_path: str | Path | None = None,
    start_timeout: float = 900,
) -> dict[str, AcceptanceResult]:
    """The same conversations through a vLLM engine serving the draft (started here unless ``engine_url``)."""
    del log_path, start_timeout  # the engine logs under POLYSPEC_HOME/logs and waits up to 900 s (_score_one_engine)
    prompts = load_mtbench(languages, turns=turns, categories=categories, limit=limit)
    options = EvalOptions(k=k, max_new_tokens=max_new_tokens, engine_url=engine_url, concurrency=concurrency,
                          method="vllm")
    draft = DraftChoice(name="draft", path=Path(draft_path))
    verifier = verifier_info(verifier_path)
    return _per_language(prompts, lambda items: score_vllm([draft], verifier, items, options), k)


def evaluation_rows(
    results: dict[str, AcceptanceResult], *, method: str, benchmark: str = "mtbench", domain: str = "general"
) -> list[dict[str, Any]]:
    """Rows for `registry.Registry.add_evaluation(draft, **row)` (languages without a verify step are left out)."""
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
        if r.mean_acceptance_length is not None
    ]


def _mal(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def results_table(results: dict[str, AcceptanceResult], title: str = "acceptance") -> Any:
    """A rich table: one row per language, acceptance per position and mean acceptance length."""
    k = max((r.k for r in results.values()), default=0)
    table = Table(title=title)
    for col in ["lang", *[f"pos {i}" for i in range(1, k + 1)], "mean acc. len", "prompts", "tokens", "steps"]:
        table.add_column(col, justify="right" if col != "lang" else "left")
    for lang, r in sorted(results.items()):
        table.add_row(lang, *[f"{a:.3f}" for a in r.acceptance], _mal(r.mean_acceptance_length),
                      str(r.num_prompts), str(r.num_tokens), str(r.num_spec_steps))
    return table
