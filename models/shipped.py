"""Drafts shipped inside the package (models/drafts/), so a deployment can serve real acceptance
without training first. Each is listed in models/drafts/manifest.json with the sha256 of every file,
its provenance and the evaluations measured for it. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.checksums import verify_tree

SHIPPED_DIR = Path(__file__).resolve().parent / "drafts"
MANIFEST = SHIPPED_DIR / "manifest.json"


class ShippedDraftError(RuntimeError):
    """A shipped draft is missing or its files differ from the recorded checksums."""


@dataclass(frozen=True)
class ShippedDraft:
    name: str
    path: Path
    verifier: str
    languages: list[str]
    role: str  # "base" | "finetuned" | "from-scratch"
    parent: str | None
    checksums: dict[str, str]
    provenance: dict[str, Any] = field(default_factory=dict)
    evaluations: list[dict[str, Any]] = field(default_factory=list)

    def verify(self) -> None:
        """Raise ShippedDraftError unless every file matches its recorded sha256."""
        problems = verify_tree(self.path, self.checksums)
        if problems:
            raise ShippedDraftError(f"shipped draft {self.name} is damaged: " + "; ".join(problems))


def shipped_drafts(verifier: str | None = None, manifest: Path = MANIFEST) -> list[ShippedDraft]:
    """The shipped drafts (for one verifier when given), parents before children."""
    if not manifest.is_file():
        return []
    entries = json.loads(manifest.read_text(encoding="utf-8"))["drafts"]
    drafts = [
        ShippedDraft(
            name=e["name"], path=manifest.parent / e["dir"], verifier=e["verifier"], languages=list(e["languages"]),
            role=e["role"], parent=e.get("parent"), checksums=dict(e["checksums"]),
            provenance=dict(e.get("provenance", {})), evaluations=list(e.get("evaluations", [])),
        )
        for e in entries
    ]
    return [d for d in drafts if verifier is None or d.verifier == verifier]


def shipped_for_language(verifier: str, language: str) -> ShippedDraft | None:
    """The shipped draft made for ``language`` (its first language), if any."""
    for draft in shipped_drafts(verifier):
        if draft.languages and draft.languages[0] == language:
            return draft
    return None
