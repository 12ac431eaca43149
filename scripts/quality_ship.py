"""Ship a quality run's drafts: copy them into models/drafts/, write the manifest entries, the model cards.

    python scripts/quality_ship.py RUN_DIR DRAFTS_DIR --run-name quality16c [--keep ru]
    python scripts/quality_ship.py RUN_DIR DRAFTS_DIR --run-name quality16d --add --drop ja --primary ja

RUN_DIR is scripts/quality_gpu.py's output (eval.json, run.json); DRAFTS_DIR holds the drafts restored with
``scripts/quality_data.py restore`` (every hash checked there). One draft per language is shipped: the English
base (role ``base``) and each ``LANG-greedy`` draft as ``smollm2-135m-instruct-LANG``. Each manifest entry gets
the run's offline MT-Bench-160 records (all and non-degenerate answers, nine languages) as evaluations, and
its data provenance (sources, licences, weights, prompt counts) and training summary as provenance, which the
registry keeps when the draft is installed. A ``--keep`` language keeps its shipped weights; its MT-Bench-160
records are replaced by the same run's (``shipped-LANG``), so that every shipped draft is measured by one
evaluator. Afterwards regenerate docs/results/acceptance.json (docs/shipped-drafts.md has the commands).

``--add`` keeps every other shipped draft as it is (weights, evaluations, provenance) and adds this run's
drafts; ``--drop LANG`` removes the draft made first for LANG. The multilingual draft ships as
``smollm2-135m-instruct-multi`` with all its languages, ``--primary`` first: the language it is the shipped
draft for (``models.shipped.shipped_for_language`` reads the first).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from polyspec.core.atomic import atomic_write_json, atomic_write_text
from polyspec.models.card import model_card
from polyspec.models.checksums import sha256_tree
from polyspec.models.shipped import MAX_WEIGHTS_BYTES as SIZE_LIMIT
from polyspec.models.shipped import ShippedDraft
from polyspec.registry.artifacts import SIDE_FILES

ROOT = Path(__file__).resolve().parents[1]
DRAFTS = ROOT / "models" / "drafts"
VERIFIER = "smollm2-135m-instruct"
BASE = "en-greedy-v8k"
SHIPPED_FILES = ("config.json", "model.safetensors")
TOTAL_LIMIT = 200_000_000


def evaluations(records: list[dict[str, Any]], draft: str, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's records of ``draft`` as registry evaluation rows (registry.store.add_evaluation's fields)."""
    rows = []
    for r in records:
        if r["draft"] != draft or r["mean_acceptance_length"] is None:
            continue
        rows.append({"benchmark": r["benchmark"], "language": r["language"], "domain": "general", "k": r["k"],
                     # from the rounded positions, so the pair stays consistent (the registry checks it)
                     "acceptance": r["positions"], "mean_acceptance_length": 1 + sum(r["positions"]),
                     "num_prompts": r["n_prompts"], "num_tokens": r["num_tokens"], "method": r["method"],
                     "subset": r["subset"], "degenerate_share": r["degenerate_share"],
                     "details": {"histogram": r["histogram"], "num_answers": r["num_answers"], **meta}})
    return rows


def provenance(run: dict[str, Any], lang: str, role: str, run_name: str, commit: str) -> dict[str, Any]:
    phase = run["phases"][lang]
    # the multilingual phase trains on the answers of the phase that answered every language ("all")
    answered = phase.get("answers") or run["phases"].get("all", {}).get("answers", {})
    answers = {k: v for k, v in answered.items() if k != "examples"}
    train = {k: v for k, v in phase["train"].items() if k != "last"}
    return {"role": role, "run": run_name, "code_version": commit,
            "trained_on": f"1x {run['device']} (scripts/quality_gpu.py, CUDA, bf16)",
            "recipe": "verifier's greedy answers (the serving decoding, loops kept), 256 new tokens; "
                      + {"base": "from scratch, 8,192-token vocabulary",
                         "finetuned": "fine-tune of the English base, 1:1 English replay",
                         "from-scratch": "from scratch, own 8,192-token vocabulary, 1:2 English replay",
                         "multilingual": "from scratch on the nine MT-Bench languages' answers (equal rows per "
                                         "language), merged 12,288-token vocabulary (round robin over the "
                                         "languages' own rankings)"}[role],
            "aux_layers": run["aux_layers"], "verifier_embed_sha256": run["verifier_embed_sha256"],
            "data": phase["groups"], "answers": answers, "train": train,
            "evaluation": "offline teacher-forced chain acceptance on the verifier's greedy MT-Bench answers "
                          "(160 turns per language, 256 new tokens, k=3), all and non-degenerate answers"}


def ship(run_dir: Path, drafts_dir: Path, run_name: str, keep: list[str], add: bool = False,
         drop: tuple[str, ...] = (), primary: str | None = None) -> list[dict[str, Any]]:
    run = json.loads((run_dir / "run.json").read_text())
    ev = json.loads((run_dir / "eval.json").read_text())
    meta = {"run": run_name, "platform": f"1x {run['device']}, bf16", "max_new_tokens": ev["max_new_tokens"],
            "degenerate_measure": ev["degenerate_measure"]}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    old = {e["name"]: e for e in json.loads((DRAFTS / "manifest.json").read_text())["drafts"]}
    base_name = f"{VERIFIER}-en"
    entries = []
    for src in sorted((p for p in drafts_dir.iterdir() if p.is_dir()), key=lambda p: (p.name != BASE, p.name)):
        lang = "en" if src.name == BASE else src.name.split("-")[0]
        records = [r for r in ev["records"] if r["draft"] == src.name]
        role = records[0]["role"]
        langs = [lang]
        if role == "multilingual":
            served = sorted(records[0]["languages"])
            langs = [primary, *(x for x in served if x != primary)] if primary in served else served
        name = f"{VERIFIER}-{lang}"
        dest = DRAFTS / name
        if (src / "model.safetensors").stat().st_size > SIZE_LIMIT:
            raise SystemExit(f"{src.name} exceeds {SIZE_LIMIT} bytes")
        dest.mkdir(parents=True, exist_ok=True)
        for f in SHIPPED_FILES:
            shutil.copyfile(src / f, dest / f)
        entries.append({"name": name, "dir": name, "verifier": VERIFIER, "languages": langs, "role": role,
                        "parent": base_name if role == "finetuned" else None,
                        "provenance": provenance(run, "multi" if role == "multilingual" else lang, role, run_name,
                                                 commit),
                        "checksums": sha256_tree(dest, exclude=SIDE_FILES),
                        "evaluations": evaluations(ev["records"], src.name, meta)})
    for lang in keep:
        entry = old[f"{VERIFIER}-{lang}"]
        kept = [e for e in entry["evaluations"] if (e["benchmark"], e["method"]) != (ev["benchmark"], "offline")]
        entries.append({**entry, "evaluations": kept + evaluations(ev["records"], f"shipped-{lang}", meta)})
    if add:  # the manifest's order stays; a new draft takes the place of the one it drops, else goes last
        new = {e["languages"][0]: e for e in entries}
        merged = []
        for entry in old.values():
            first = entry["languages"][0]
            if first in drop:
                shutil.rmtree(DRAFTS / entry["dir"])
            if first in new:
                merged.append(new.pop(first))
            elif first not in drop:
                merged.append(entry)
        entries = merged + list(new.values())
    total = sum((DRAFTS / e["dir"] / "model.safetensors").stat().st_size for e in entries)
    if total > TOTAL_LIMIT:
        raise SystemExit(f"the shipped drafts weigh {total} bytes, over {TOTAL_LIMIT}")
    for entry in entries:
        draft = ShippedDraft.from_entry(entry, DRAFTS / entry["dir"])
        draft.verify()
        atomic_write_text(DRAFTS / entry["dir"] / "README.md", model_card(draft))
    atomic_write_json(DRAFTS / "manifest.json", {"drafts": entries}, indent=1)
    return entries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("drafts_dir", type=Path)
    ap.add_argument("--run-name", required=True)
    ap.add_argument("--keep", action="append", default=[], help="a language whose shipped draft stays")
    ap.add_argument("--add", action="store_true", help="keep every other shipped draft and add this run's")
    ap.add_argument("--drop", action="append", default=[], help="with --add: remove the draft made first for LANG")
    ap.add_argument("--primary", default=None, help="the multilingual draft's first language")
    args = ap.parse_args()
    if args.drop and not args.add:
        ap.error("--drop needs --add")
    for e in ship(args.run_dir, args.drafts_dir, args.run_name, args.keep, args.add, tuple(args.drop), args.primary):
        size = (DRAFTS / e["dir"] / "model.safetensors").stat().st_size
        print(f"{e['name']:32} {e['role']:13} {size / 1e6:5.1f} MB  {len(e['evaluations'])} evaluations")


if __name__ == "__main__":
    main()
