"""`polyspec train --plan LANG`: turn the registry's add-language plan into a RunConfig.

`polyspec registry add-language LANG --prompts FILE` records, per verifier, a plan (``finetune`` or
``from-scratch-custom-vocab``) and the prompts file. Here that becomes a run: fine-tune from the active
draft of that verifier, or train from scratch with a vocabulary built from the language's own answers
(the active draft, when there is one, tops the vocabulary up). Everything else keeps the recipe defaults.
"""

from __future__ import annotations

from polyspec.core.settings import get_settings
from polyspec.registry import open_registry
from polyspec.registry.errors import NotFound

from typing import Any

from polyspec.training.config import RunConfig, default_run_id
from polyspec.training.errors import PlanError


def active_draft(reg: Any, verifier: str) -> Any | None:
    """The active draft of the verifier serving the default language (else the newest active one)."""
    active = [d for d in reg.drafts(verifier=verifier, status="active")]
    if not active:
        return None
    default_lang = get_settings().default_language
    preferred = [d for d in active if default_lang in d.languages]
    return (preferred or active)[-1]


def config_from_plan(language: str, *, run_id: str | None = None, resume: bool = False,
                     max_prompts: int | None = None, engine: str | None = None) -> RunConfig:

    verifier = get_settings().default_verifier
    with open_registry() as reg:
        try:
            profile = reg.get_language(language, verifier=verifier)
        except NotFound:
            raise PlanError(f"no add-language plan for {language!r} (verifier {verifier}); run "
                            f"`polyspec registry add-language {language} --prompts FILE` first") from None
        parent = active_draft(reg, verifier)
    if not profile.prompts_file:
        raise PlanError(f"the {language!r} profile records no prompts file; re-run add-language with --prompts")
    if profile.plan == "finetune" and parent is None:
        raise PlanError(f"plan for {language!r} is finetune but verifier {verifier} has no active draft; "
                        "promote one or train from scratch with `polyspec train run`")
    mode = "finetune" if profile.plan == "finetune" else "from-scratch-custom-vocab"
    if resume and run_id:
        from polyspec.training.runs import Run

        return Run.open(run_id).config
    tree: dict[str, Any] = {
        "run_id": run_id or default_run_id(profile.language, mode),
        "language": profile.language,
        "verifier": verifier,
        "mode": mode,
        "parent_draft": parent.ref if parent is not None else None,
        "prompts": {"files": [profile.prompts_file], **({"max_prompts": max_prompts} if max_prompts else {})},
        "answers": {"engine_url": engine} if engine else {},
    }
    return RunConfig.model_validate(tree)
