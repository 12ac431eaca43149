"""Ship a multilingual draft made by `polyspec train run --languages ...`: it replaces the shipped
smollm2-135m-instruct-multi in place (same name and directory, the manifest's order kept).

    python scripts/multilingual_ship.py DIR --prompts RUN_DIR/prompts --run-name multi18b \\
        --command "..." [--parent smollm2-135m-instruct-en]

DIR is what scripts/multilingual_device.sh brought back: run.json (the run's `--json` output), results.json
(evaluate/results.json), run-files.tgz (the run's small JSON files, unpacked as DIR/run-files), draft.part*,
draft.sha256 and draft-config.json. ``--prompts`` is the run's prompts stage (made here by
scripts/multilingual_prep.sh): its train.jsonl, read against the data pack (``--data``), gives the sources and
licences of the training prompts.

The weights are joined and checked against draft.sha256 and the size cap; the manifest entry gets the run's
MT-Bench-160 and held-out figures (all and non-degenerate answers) as evaluations, and as provenance the
command, the device, the mixture, the data per language (prompt counts, sources with licences), the vocabulary
coverage and the training summary. The model card is written again from the entry. Afterwards regenerate what
is made from the shipped drafts (docs/shipped-drafts.md lists the commands).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from polyspec.core.atomic import atomic_write_json, atomic_write_text
from polyspec.models.card import model_card
from polyspec.models.checksums import sha256_tree
from polyspec.models.shipped import MAX_WEIGHTS_BYTES, ShippedDraft
from polyspec.registry.artifacts import SIDE_FILES

ROOT = Path(__file__).resolve().parents[1]
DRAFTS = ROOT / "models" / "drafts"
NAME = "smollm2-135m-instruct-multi"
TOTAL_LIMIT = 200_000_000


def join_weights(folder: Path, dest: Path) -> None:
    """draft.part0, draft.part1, ... joined into ``dest``, checked against draft.sha256."""
    want = (folder / "draft.sha256").read_text(encoding="utf-8").split()[0]
    parts = sorted(folder.glob("draft.part*"), key=lambda p: int(p.name.removeprefix("draft.part")))
    with dest.open("wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    got = hashlib.sha256(dest.read_bytes()).hexdigest()
    if got != want:
        raise SystemExit(f"joined weights have sha256 {got}, draft.sha256 says {want}")
    if dest.stat().st_size > MAX_WEIGHTS_BYTES:
        raise SystemExit(f"the draft weighs {dest.stat().st_size} bytes, over the {MAX_WEIGHTS_BYTES} cap")


def evaluations(results: dict[str, Any], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The candidate's figures as manifest evaluation rows: MT-Bench-160 and heldout-N, both subsets."""
    rows = []
    for r in results["figures"]:
        if r["draft"] != "candidate" or r["mean_acceptance_length"] is None:
            continue
        positions = [round(p, 4) for p in r["acceptance"]]
        bench = "mtbench-160" if r["benchmark"] == "mtbench" else f"{r['benchmark']}-{r['num_answers']}"
        rows.append({"benchmark": bench, "language": r["language"], "domain": "general", "k": r["k"],
                     # from the rounded positions, so the pair stays consistent (the registry checks it)
                     "acceptance": positions, "mean_acceptance_length": round(1 + sum(positions), 4),
                     "num_prompts": r["num_prompts"], "num_tokens": r["num_tokens"], "method": results["method"],
                     "subset": r["subset"], "degenerate_share": round(r["degenerate_share"], 4),
                     "details": {"histogram": r["histogram"], "num_answers": r["num_answers"], **meta}})
    return sorted(rows, key=lambda e: (e["benchmark"] != "mtbench-160", e["benchmark"], e["language"], e["subset"]))


def pack_sources(data: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(file name, record id) -> (source, licence) over the data pack's training files (train/, train/more/)."""
    out = {}
    for path in [*sorted((data / "train").glob("*.jsonl")), *sorted((data / "train" / "more").glob("*.jsonl.gz"))]:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    out.setdefault((path.name.removesuffix(".gz"), rec["id"]), (rec["source"], rec["license"]))
    return out


def data_provenance(summary: dict[str, Any], train_jsonl: Path, data: Path) -> dict[str, Any]:
    """Per language: the counts of the mixture and the sources (with licences) of its training prompts."""
    known = pack_sources(data)
    sources: dict[str, Counter[tuple[str, str]]] = {}
    for line in train_jsonl.read_text(encoding="utf-8").split("\n"):  # not splitlines: U+2028 inside strings
        if not line.strip():
            continue
        rec = json.loads(line)
        source, licence = known.get((rec["source_file"], rec["id"]), ("?", "?"))
        sources.setdefault(rec["lang"], Counter())[(source.split("@")[0].split(":")[0], licence)] += 1
    out = {}
    for lang, row in summary["data"].items():
        out[lang] = {**{k: row[k] for k in ("weight", "available", "train", "heldout", "share")},
                     "sources": [{"source": src, "license": lic, "prompts": n}
                                 for (src, lic), n in (sources.get(lang) or Counter()).most_common()]}
    return out


def entry_for(folder: Path, prompts: Path, data: Path, run_name: str, command: str, parent: str | None,
              old: dict[str, Any]) -> dict[str, Any]:
    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    summary, results = run["summary"], json.loads((folder / "results.json").read_text(encoding="utf-8"))
    files = folder / "run-files"
    fit = json.loads((files / "fit" / "DONE.json").read_text(encoding="utf-8"))["summary"]
    vocab = json.loads((files / "vocab" / "DONE.json").read_text(encoding="utf-8"))["summary"]
    config = json.loads((files / "run.json").read_text(encoding="utf-8"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    device = summary["device"].removeprefix("cuda (").removesuffix(", bf16)")
    meta = {"run": run_name, "platform": f"1x {device}, bf16", "max_new_tokens": config["eval"]["max_new_tokens"],
            "degenerate_measure": "ngram"}
    provenance = {
        "role": "multilingual", "run": run_name, "code_version": commit,
        "trained_on": f"1x {device} (polyspec train run --gpus 1: torchrun, CUDA, bf16)", "command": command,
        "recipe": (f"verifier's greedy answers, {config['answers']['max_new_tokens']} new tokens; "
                   + (f"warm start from {parent} (its weights; vocabulary grown from the verifier's lm_head rows)"
                      if parent else "from scratch")
                   + f", merged {vocab['draft_vocab_size']:,}-token vocabulary with coverage target "
                   f"{vocab['coverage_target']} per language; {config['fit']['epochs']} epochs at lr "
                   f"{config['fit']['lr']}, {fit['steps']} steps"),
        "aux_layers": config["hidden"]["aux_layer_ids"] or old["provenance"].get("aux_layers"),
        "mix": config["mix"], "data": data_provenance(summary, prompts / "train.jsonl", data),
        "vocab": {k: vocab[k] for k in ("draft_vocab_size", "coverage_target", "coverage", "grown_from", "slots")},
        "train": {k: v for k, v in fit.items() if not isinstance(v, (dict, list)) or k == "last_epoch_full_acc"},
        "stage_seconds": summary["seconds"],
        "evaluation": (f"offline teacher-forced chain acceptance on the verifier's greedy answers (k={results['k']}): "
                       "MT-Bench-160 of the nine MT-Bench languages (turns 1 and 2), and up to "
                       f"{config['eval']['heldout_max_prompts']} held-out prompts of every language; all and "
                       "non-degenerate answers"),
    }
    return {"name": NAME, "dir": NAME, "verifier": old["verifier"], "languages": summary["languages"],
            "role": "multilingual", "parent": parent, "provenance": provenance,
            "evaluations": evaluations(results, meta)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--prompts", type=Path, required=True, help="the run's prompts stage folder (train.jsonl)")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data", help="the data pack")
    ap.add_argument("--run-name", required=True)
    ap.add_argument("--command", required=True, help="the commands that made the run")
    ap.add_argument("--parent", default=None, help="the shipped draft the run warm-started from")
    args = ap.parse_args()
    manifest = json.loads((DRAFTS / "manifest.json").read_text(encoding="utf-8"))
    index = next(i for i, e in enumerate(manifest["drafts"]) if e["name"] == NAME)
    entry = entry_for(args.folder, args.prompts, args.data, args.run_name, args.command, args.parent, manifest["drafts"][index])
    dest = DRAFTS / NAME
    join_weights(args.folder, dest / "model.safetensors")
    shutil.copyfile(args.folder / "draft-config.json", dest / "config.json")
    entry = {**entry, "checksums": sha256_tree(dest, exclude=SIDE_FILES)}
    manifest["drafts"][index] = {k: entry[k] for k in ("name", "dir", "verifier", "languages", "role", "parent",
                                                       "provenance", "checksums", "evaluations")}
    total = sum((DRAFTS / e["dir"] / "model.safetensors").stat().st_size for e in manifest["drafts"])
    if total > TOTAL_LIMIT:
        raise SystemExit(f"the shipped drafts weigh {total} bytes, over {TOTAL_LIMIT}")
    draft = ShippedDraft.from_entry(entry, dest)
    draft.verify()
    atomic_write_text(dest / "README.md", model_card(draft))
    atomic_write_json(DRAFTS / "manifest.json", manifest, indent=1)
    print(f"{NAME}: {(dest / 'model.safetensors').stat().st_size / 1e6:.1f} MB, {len(entry['languages'])} languages, "
          f"{len(entry['evaluations'])} evaluations; all shipped drafts {total / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
