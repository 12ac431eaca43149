"""The model card (README.md) that ``polyspec models push`` writes beside a draft.

Its YAML front matter is what the Hugging Face Hub indexes (library, base model, languages, licence,
tags) plus a ``polyspec`` block with the sha256 of every file, which ``polyspec models pull`` verifies.
The body says how to serve the draft with vLLM and lists the evaluations recorded for it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from polyspec.models.shipped import ShippedDraft
from polyspec.models.verifiers import KNOWN_VERIFIERS

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def is_repo_id(text: str) -> bool:
    return bool(_REPO_ID.fullmatch(text)) and ".." not in text


def base_model_of(verifier: str) -> str | None:
    """The Hub id of a verifier: itself when it is one, else the id a bundled alias was built from."""
    if is_repo_id(verifier):
        return verifier

    source = KNOWN_VERIFIERS.get(verifier)
    first = source.description.split()[0] if source and source.description else ""
    return first if is_repo_id(first) else None


def _front_matter(draft: ShippedDraft, license: str, base_model: str | None) -> dict[str, Any]:
    front: dict[str, Any] = {"library_name": "speculators"}
    if base_model:
        front["base_model"] = base_model
    if draft.languages:
        front["language"] = list(draft.languages)
    front["license"] = license
    front["pipeline_tag"] = "text-generation"
    front["tags"] = ["speculators", "eagle3", "speculative-decoding", "vllm", "polyspec"]
    front["polyspec"] = {"name": draft.name, "verifier": draft.verifier, "role": draft.role, "parent": draft.parent,
                         "sha256": dict(sorted(draft.checksums.items()))}
    return front


def _evaluation_rows(evaluations: list[dict[str, Any]]) -> list[str]:
    rows = ["| benchmark | language | domain | method | answers | k | mean acceptance length | acceptance per position "
            "| prompts |", "|---|---|---|---|---|---:|---:|---|---:|"]
    for e in evaluations:
        per_position = ", ".join(f"{a:.3f}" for a in e.get("acceptance") or [])
        mal = e.get("mean_acceptance_length")
        rows.append(f"| {e.get('benchmark', '')} | {e.get('language', '')} | {e.get('domain', '')} | "
                    f"{e.get('method', '')} | {e.get('subset', 'all')} | {e.get('k', '')} | {f'{mal:.3f}' if mal is not None else '—'} | "
                    f"{per_position} | {e.get('num_prompts', '')} |")
    return rows


def model_card(draft: ShippedDraft, *, license: str = "apache-2.0", base_model: str | None = None,
               repo_id: str | None = None) -> str:
    """README.md for ``draft``: YAML front matter, how to serve it, evaluations, checksums."""
    base = base_model or base_model_of(draft.verifier)
    front = yaml.safe_dump(_front_matter(draft, license, base), sort_keys=False, allow_unicode=True)
    where = repo_id or "<this repository or directory>"
    langs = ", ".join(draft.languages) or "unspecified languages"
    parent = f" from `{draft.parent}`" if draft.parent else ""
    spec = json.dumps({"method": "eagle3", "model": where, "num_speculative_tokens": 3})
    lines = [
        "---", front.rstrip(), "---", "",
        f"# {draft.name}", "",
        f"An EAGLE-3 draft (speculator) for the verifier `{base or draft.verifier}`, trained for {langs} "
        f"({draft.role}{parent}) with polyspec and saved in the "
        "[speculators](https://github.com/vllm-project/speculators) format. It proposes tokens that the "
        "verifier checks, so generation is faster without changing the output.", "",
        "## Use", "",
        "With vLLM:", "", "```bash",
        f"vllm serve {base or draft.verifier} --speculative-config '{spec}'", "```", "",
        "With polyspec (verifies the sha256 below, installs into `$POLYSPEC_HOME/drafts/`):", "", "```bash",
        f"polyspec models pull {draft.name} --from {where}", "```", "",
        "## Evaluations", "",
    ]
    if draft.evaluations:
        lines += ["Mean acceptance length = 1 + the sum of the per-position acceptance rates (k proposed tokens "
                  "per step).", "", *_evaluation_rows(draft.evaluations), ""]
    else:
        lines += ["No evaluation recorded.", ""]
    lines += ["## Files", "", "| file | sha256 |", "|---|---|"]
    lines += [f"| {f} | `{s}` |" for f, s in sorted(draft.checksums.items())]
    return "\n".join(lines) + "\n"
