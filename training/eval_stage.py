"""Stage 6: measure the candidate (and the draft it started from) with `polyspec eval`'s code.

- held-out prompts of the target language: offline teacher-forced chain acceptance (training.eval_offline);
- MT-Bench turn 1 of every evaluated language: offline in the same batched pass, or through a vLLM
  engine serving the draft (``eval.method = "vllm"``, training/evaluate.py).

Both drafts are measured on identical prompts in the same run, so before/after is a like-for-like
comparison. results.json holds every AcceptanceResult; the registry stage records them.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from polyspec.core.atomic import atomic_write_json
from polyspec.models.acceptance import AcceptanceResult
from polyspec.models.degenerate import answer_shape
from polyspec.training.benchmarks import BenchPrompt, load_mtbench, mtbench_languages
from polyspec.training.config import RunConfig
from polyspec.training.eval_api import Answer, figures
from polyspec.training.eval_offline import score_offline
from polyspec.training.eval_options import DraftChoice, EvalOptions
from polyspec.training.evaluate import evaluate_vllm, verifier_info
from polyspec.training.multilingual import heldout_by_language
from polyspec.training.prompts import read_jsonl
from polyspec.training.runs import console


def eval_languages(cfg: RunConfig) -> list[str]:
    """The configured list, else the target language plus the languages the registry serves now."""
    if cfg.eval.languages is not None:
        wanted = list(cfg.eval.languages)
    elif cfg.mix is not None:
        wanted = list(cfg.mix.languages)
    else:
        wanted = [cfg.language, *served_languages()]
    available = set(mtbench_languages())
    out = list(dict.fromkeys(lang for lang in wanted if lang in available))
    missing = sorted(set(wanted) - available)
    if missing:
        console.print(f"[yellow]no bundled MT-Bench file for {', '.join(missing)}: held-out prompts only there")
    return out


def served_languages() -> list[str]:
    """Languages of the active deployments (empty when no registry is reachable)."""
    try:
        from polyspec.registry import open_registry

        with open_registry() as reg:
            views = reg.active_deployments()
    except Exception:  # noqa: BLE001 - evaluation must not fail because the registry is absent
        return []
    return sorted({lang for view in views for lang in view.languages})


def _heldout_items(prompts_dir: Path, cfg: RunConfig) -> list[BenchPrompt]:
    """The run's held-out prompts as one-turn benchmark items (the last user turn of each conversation); a
    multilingual run's per language, each language's own split."""
    rows, limit = read_jsonl(prompts_dir / "heldout.jsonl"), cfg.eval.heldout_max_prompts
    if cfg.mix is not None:
        return [BenchPrompt(f"heldout-{lang}-{i}", lang, "heldout", 1, t)
                for lang, texts in heldout_by_language(rows, limit).items() for i, t in enumerate(texts)]
    texts = [next(m["content"] for m in reversed(r["messages"]) if m["role"] == "user") for r in rows]
    texts = texts[:limit] if limit else texts
    return [BenchPrompt(f"heldout-{i}", cfg.language, "heldout", 1, t) for i, t in enumerate(texts)]


def _measure_offline(drafts: list[DraftChoice], verifier: Any, items: dict[str, list[BenchPrompt]], cfg: RunConfig,
                     device: str) -> tuple[dict[str, dict[str, dict[str, AcceptanceResult]]], list[dict[str, Any]]]:
    """role -> bench -> language -> result, every draft scored on the same verifier answers (teacher-forced);
    and the figures over all answers and over non-degenerate ones (training.eval_api.figures), per bench."""
    keys = [(bench, it) for bench, its in items.items() for it in its]
    if not keys:
        return {d.name: {} for d in drafts}, []
    options = EvalOptions(k=cfg.eval.k, max_new_tokens=cfg.eval.max_new_tokens, device=device)
    scored, _ = score_offline(drafts, verifier, [it for _, it in keys], options)
    out: dict[str, dict[str, dict[str, AcceptanceResult]]] = {}
    for d in drafts:
        grouped: dict[str, dict[str, list[Any]]] = {}
        for (bench, it), (_, per) in zip(keys, scored, strict=True):
            grouped.setdefault(bench, {}).setdefault(it.language or cfg.language, []).append(per[d.name])
        out[d.name] = {bench: {lang: AcceptanceResult.of_details(det, cfg.eval.k) for lang, det in per_lang.items()}
                       for bench, per_lang in grouped.items()}
    answers: dict[tuple[str, str], list[Any]] = {}
    for (bench, it), (ids, per) in zip(keys, scored, strict=True):
        lang = it.language or cfg.language
        answers.setdefault((bench, lang), []).append(Answer(it, lang, answer_shape(ids), per))
    rows = [{"benchmark": bench, **asdict(row)} for (bench, lang), group in sorted(answers.items())
            for d in drafts for row in figures(d.name, lang, group, cfg.eval.k)]
    return out, rows


def run_evaluation(out_dir: Path, cfg: RunConfig, verifier_path: Path, candidate: Path, baseline: Path | None,
                   prompts_dir: Path, device: str) -> dict[str, Any]:
    languages = eval_languages(cfg)
    mtbench = load_mtbench(languages, turns=cfg.eval.mtbench_turns, limit=cfg.eval.mtbench_max_questions) \
        if languages else {}
    items = {"heldout": _heldout_items(prompts_dir, cfg)}
    if cfg.eval.method == "offline":
        items["mtbench"] = [it for its in mtbench.values() for it in its]
    paths = {"candidate": candidate, **({"baseline": baseline} if baseline and cfg.eval.evaluate_parent else {})}
    drafts = [DraftChoice(name=role, path=Path(path)) for role, path in paths.items()]
    results, rows = _measure_offline(drafts, verifier_info(verifier_path), items, cfg, device)
    for role, path in paths.items():
        results[role].setdefault("heldout", {})
        results[role].setdefault("mtbench", {})
        if cfg.eval.method == "vllm" and languages:
            results[role]["mtbench"] = evaluate_vllm(path, verifier_path, languages, k=cfg.eval.k,
                                                     max_new_tokens=cfg.eval.max_new_tokens,
                                                     limit=cfg.eval.mtbench_max_questions)
    serial = {role: {bench: {lang: r.to_dict() for lang, r in per.items()} for bench, per in benches.items()}
              for role, benches in results.items()}
    atomic_write_json(out_dir / "results.json", {"method": cfg.eval.method, "k": cfg.eval.k, "results": serial,
                                                 "mtbench_turns": cfg.eval.mtbench_turns, "figures": rows})
    _print(results)
    return _summary(serial, rows)


def _summary(serial: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {role: {bench: {lang: _round(r["mean_acceptance_length"]) for lang, r in per.items()}
                                  for bench, per in benches.items()} for role, benches in serial.items()}
    for row in rows:  # the non-degenerate answers' figure beside each: offline method only
        if row["subset"] != "all":
            out.setdefault(f"{row['draft']}_{row['subset']}", {}).setdefault(row["benchmark"], {})[row["language"]] = \
                _round(row["mean_acceptance_length"])
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _print(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    table = Table(title="mean acceptance length (1 + sum of per-position acceptance)")
    for col in ("benchmark", "language", *results):
        table.add_column(col, justify="left" if col in ("benchmark", "language") else "right")
    for bench in ("heldout", "mtbench"):
        langs = sorted({lang for role in results.values() for lang in role.get(bench, {})})
        for lang in langs:
            cells = [_cell(results[r].get(bench, {}).get(lang)) for r in results]
            table.add_row(bench, lang, *cells)
    console.print(table)


def _cell(result: AcceptanceResult | None) -> str:
    mal = result.mean_acceptance_length if result is not None else None
    return "-" if mal is None else f"{mal:.3f}"
