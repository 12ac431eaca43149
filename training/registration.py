"""Stage 7: record the candidate draft in the registry with its evaluations and provenance.

The draft is copied out of the run to ``$POLYSPEC_HOME/drafts/RUN_ID`` (so deleting a run never breaks
the registry), imported as a *candidate* (the registry checksums every file), and every evaluation of
the run is added. The parent's measurements from this run are added to the parent too when it is a
registered draft, so the promotion gate compares like with like. Promotion stays a separate,
deliberate step: ``polyspec registry promote NAME@VERSION``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from polyspec.core.atomic import atomic_dir
from polyspec.registry import open_registry
from polyspec.training.config import RunConfig
from polyspec.training.runs import code_version, console, file_record


def durable_copy(src: Path, home: Path, run_id: str) -> Path:
    dest = home / "drafts" / run_id
    if dest.is_dir() and (dest / "model.safetensors").is_file():
        return dest
    with atomic_dir(dest) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
    return dest


def provenance(run: Any, summaries: dict[str, Any], parent_ref: str | None, parent_path: Path | None) -> dict[str, Any]:
    cfg: RunConfig = run.config
    prompt_files = [*cfg.prompts.files, *(r.path for r in cfg.prompts.replay)]
    return {
        "run_id": cfg.run_id,
        "mode": cfg.mode,
        "seed": cfg.seed,
        "code_version": code_version(),
        "recipe": cfg.fit.model_dump(mode="json"),
        "data": {
            "prompt_files": {str(Path(p).resolve()): file_record(Path(p))["sha256"] for p in prompt_files},
            "prompts": summaries.get("prompts"),
            "answers": summaries.get("answers"),
            "hidden_states": summaries.get("hidden-states"),
        },
        "vocab": summaries.get("vocab"),
        "fit": summaries.get("fit"),
        "parent": {"ref": parent_ref, "path": str(parent_path) if parent_path else None},
        "mix": cfg.mix.model_dump(mode="json") if cfg.mix is not None else None,
        "config": cfg.model_dump(mode="json"),
    }


def find_registered(reg: Any, verifier: str, path: Path | None) -> str | None:
    """The registry ref of the draft stored at ``path`` (None when it is not registered)."""
    if path is None:
        return None
    want = str(Path(path).resolve())
    for rec in reg.drafts(verifier=verifier):
        if rec.location == want:
            return rec.ref
    return None


def register_candidate(run: Any, verifier_name: str, draft_dir: Path, results: dict[str, Any],
                       summaries: dict[str, Any], parent_path: Path | None, home: Path) -> dict[str, Any]:
    cfg: RunConfig = run.config
    name = cfg.registration.draft_name or f"{verifier_name}-{cfg.language}-{cfg.domain}"
    with open_registry() as reg:
        reg.ensure_verifier(verifier_name)
        parent_ref = find_registered(reg, verifier_name, parent_path)
        existing = [d for d in reg.drafts(verifier=verifier_name) if d.provenance.get("run_id") == cfg.run_id]
        if existing:  # a re-run after a crash between import and marker: do not import twice
            record = existing[-1]
            console.print(f"run already registered as {record.ref}")
        else:
            location = durable_copy(draft_dir, home, cfg.run_id)
            record = reg.import_draft(
                location, verifier=verifier_name, name=name, languages=cfg.languages, domain=cfg.domain,
                k=cfg.eval.k, parent=parent_ref, provenance=provenance(run, summaries, parent_ref, parent_path),
            )
            _add_evaluations(reg, record.ref, results.get("candidate", {}), cfg)
            if parent_ref and "baseline" in results:
                _add_evaluations(reg, parent_ref, results["baseline"], cfg)
    console.print(f"[green]registered candidate {record.ref}[/] — promote with: polyspec registry promote {record.ref}")
    return {"draft": record.ref, "location": record.location, "parent": parent_ref, "checksums": record.checksums}


def _add_evaluations(reg: Any, ref: str, benches: dict[str, Any], cfg: RunConfig) -> None:
    for bench, per_lang in benches.items():
        for lang, r in per_lang.items():
            reg.add_evaluation(
                ref, benchmark=bench, language=lang, k=r["k"], acceptance=r["acceptance"],
                num_prompts=r["num_prompts"], num_tokens=r["num_tokens"],
                method="offline" if bench == "heldout" else cfg.eval.method,
                domain=cfg.domain if bench == "heldout" else "general",
                details={"histogram": r["histogram"], "num_spec_steps": r["num_spec_steps"], "run_id": cfg.run_id},
            )
