"""Which drafts `polyspec eval` measures, and against which verifier.

A draft is given as a directory, a registry reference (``NAME`` or ``NAME@VERSION``), or the name of
a draft shipped in models/drafts. The verifier is ``--verifier`` when given, else the one the draft was
made for, else the settings' default. A draft made for another verifier is refused before any model loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polyspec.core.settings import get_settings
from polyspec.models.drafts import DraftError, inspect_draft
from polyspec.models.shipped import shipped_drafts
from polyspec.models.verifiers import resolve_verifier
from polyspec.training.eval_options import DraftChoice, DraftVerifierMismatch, EvalOptionError, UnknownDraft


def _from_registry(spec: str) -> DraftChoice | None:
    try:
        from polyspec.registry import NotFound, open_registry
    except ImportError:  # the GPU box may lack the registry's dependencies: paths and shipped names still work
        return None
    try:
        with open_registry() as reg:
            rec = reg.get_draft(spec)
    except NotFound:
        return None
    return DraftChoice(name=rec.name, path=Path(rec.location).expanduser(), verifier=rec.verifier,
                       registry_ref=rec.ref)


def resolve_draft(spec: str) -> DraftChoice:
    """A directory, else a registry reference, else a shipped draft's name."""
    text = spec.strip()
    if not text:
        raise EvalOptionError("empty draft name")
    path = Path(text).expanduser()
    if path.is_dir():
        return DraftChoice(name=path.name, path=path.resolve())
    if text.startswith(("/", ".", "~")) or path.exists():
        raise UnknownDraft(f"draft directory not found: {path}")
    found = _from_registry(text)
    if found is not None:
        return found
    shipped = {d.name: d for d in shipped_drafts()}
    if text in shipped:
        d = shipped[text]
        return DraftChoice(name=d.name, path=d.path, verifier=d.verifier)
    raise UnknownDraft(f"no draft {text!r}: not a directory, not in the registry, not shipped "
                       f"(shipped: {', '.join(sorted(shipped)) or 'none'})",
                       hint="list drafts with `polyspec registry list-drafts`; give a directory to use any other")


def resolve_drafts(specs: Sequence[str], verifier: str | None) -> tuple[list[DraftChoice], Any]:
    """The drafts and the VerifierInfo they are evaluated with; every draft checked against it."""
    drafts = [resolve_draft(s) for s in specs]
    made_for = sorted({d.verifier for d in drafts if d.verifier})
    name = verifier or (made_for[0] if len(made_for) == 1 else None) or get_settings().default_verifier
    for d in drafts:
        try:
            inspect_draft(d.path)
        except DraftError as exc:
            raise EvalOptionError(f"{d.path} is not a usable Eagle3 draft: {exc}") from None
    info = resolve_verifier(name)
    for d in drafts:
        if d.verifier and d.verifier != info.name:
            raise DraftVerifierMismatch(f"draft {d.name} was made for verifier {d.verifier}, not {info.name}",
                                        hint="pass --verifier to evaluate it with the verifier it was made for")
        try:
            inspect_draft(d.path, info)
        except DraftError as exc:
            raise DraftVerifierMismatch(f"draft {d.name} does not fit verifier {info.name}: {exc}") from None
    return drafts, info
