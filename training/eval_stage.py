"""Stage 6: measure the candidate (and the draft it started from) with draftlab's evaluation code.

- held-out prompts of the target language: offline greedy speculative decoding (models.acceptance);
- MT-Bench turn 1 of every evaluated language (training/evaluate.py): offline, or through a vLLM
  engine serving the draft (``eval.method = "vllm"``).

Both drafts are measured on identical prompts in the same run, so before/after is a like-for-like
comparison. results.json holds every AcceptanceResult; the registry stage records them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.config import RunConfig
from training.prompts import read_jsonl
from training.runs import atomic_write_json, console


def eval_languages(cfg: RunConfig) -> list[str]:
    """The configured list, else the target language plus the languages the registry serves now."""
    from training.evaluate import mtbench_languages

    if cfg.eval.languages is not None:
        wanted = list(cfg.eval.languages)
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
        from registry import open_registry

        with open_registry() as reg:
            views = reg.active_deployments()
    except Exception:  # noqa: BLE001 - evaluation must not fail because the registry is absent
        return []
    return sorted({lang for view in views for lang in view.languages})


def _heldout_prompts(prompts_dir: Path, limit: int | None) -> list[str]:
    rows = read_jsonl(prompts_dir / "heldout.jsonl")
    texts = [next(m["content"] for m in reversed(r["messages"]) if m["role"] == "user") for r in rows]
    return texts[:limit] if limit else texts


def _measure_offline(draft_path: Path, verifier_path: Path, models: tuple[Any, Any], heldout: list[str],
                     mtbench: dict, cfg: RunConfig, device: str) -> dict[str, dict[str, Any]]:
    from models.acceptance import measure_acceptance_models
    from models.draft_build import load_draft

    verifier, tokenizer = models
    language = cfg.language
    draft = load_draft(draft_path, verifier_path, device=device, dtype=next(verifier.parameters()).dtype)
    out: dict[str, dict[str, Any]] = {"heldout": {}, "mtbench": {}}
    kw = {"k": cfg.eval.k, "max_new_tokens": cfg.eval.max_new_tokens}
    if heldout:
        out["heldout"][language] = measure_acceptance_models(verifier, tokenizer, draft, heldout, desc=f"held-out {language}", **kw)
    if cfg.eval.method == "offline":
        for lang, items in mtbench.items():
            out["mtbench"][lang] = measure_acceptance_models(verifier, tokenizer, draft, [p.text for p in items],
                                                             desc=f"mtbench {lang}", **kw)
    return out


def run_evaluation(out_dir: Path, cfg: RunConfig, verifier_path: Path, candidate: Path, baseline: Path | None,
                   prompts_dir: Path, device: str) -> dict[str, Any]:
    from training.evaluate import evaluate_vllm, load_mtbench

    from models.hidden import load_verifier_model

    languages = eval_languages(cfg)
    mtbench = load_mtbench(languages, limit=cfg.eval.mtbench_max_questions) if languages else {}
    heldout = _heldout_prompts(prompts_dir, cfg.eval.heldout_max_prompts)
    models = load_verifier_model(verifier_path, device=device)
    drafts = {"candidate": candidate, **({"baseline": baseline} if baseline and cfg.eval.evaluate_parent else {})}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for role, path in drafts.items():
        results[role] = _measure_offline(path, verifier_path, models, heldout, mtbench, cfg, device)
        if cfg.eval.method == "vllm" and languages:
            results[role]["mtbench"] = evaluate_vllm(path, verifier_path, languages, k=cfg.eval.k,
                                                     max_new_tokens=cfg.eval.max_new_tokens,
                                                     limit=cfg.eval.mtbench_max_questions)
    serial = {role: {bench: {lang: r.to_dict() for lang, r in per.items()} for bench, per in benches.items()}
              for role, benches in results.items()}
    atomic_write_json(out_dir / "results.json", {"method": cfg.eval.method, "k": cfg.eval.k, "results": serial})
    _print(results)
    return _summary(serial)


def _summary(serial: dict[str, Any]) -> dict[str, Any]:
    return {role: {bench: {lang: round(r["mean_acceptance_length"], 4) for lang, r in per.items()}
                   for bench, per in benches.items()} for role, benches in serial.items()}


def _print(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    from rich.table import Table

    table = Table(title="mean acceptance length (1 + sum of per-position acceptance)")
    for col in ("benchmark", "language", *results):
        table.add_column(col, justify="left" if col in ("benchmark", "language") else "right")
    for bench in ("heldout", "mtbench"):
        langs = sorted({lang for role in results.values() for lang in role.get(bench, {})})
        for lang in langs:
            cells = [f"{results[r][bench][lang].mean_acceptance_length:.3f}" if lang in results[r].get(bench, {}) else "-"
                     for r in results]
            table.add_row(bench, lang, *cells)
    console.print(table)
