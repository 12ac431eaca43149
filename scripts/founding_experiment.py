"""The founding experiment, as run on the H200: every draft, then one evaluation of all of them.

    python scripts/founding_experiment.py data DATA_DIR OUT_DIR      # split code prompts by problem
    python scripts/founding_experiment.py train --runs fr-founding,fr-more --data DIR --base DRAFT
    python scripts/founding_experiment.py evaluate --drafts NAME=DIR,... --out eval.json

Each run is a `training.pipeline` run (prompts -> answers -> hidden states -> vocab -> fit) with the
knobs below; runs marked ``reuse`` share the prompts, answers and hidden states of an earlier run
(`training.runs.reuse_stages`), so a fine-tune and a from-scratch draft see identical data. Evaluation
is `polyspec eval`'s offline scorer (training.eval_offline.OfflineScorer): the verifier's greedy answers to
every turn of the given benchmark files (default: every bundled MT-Bench language; turn 2 asked after the
verifier's own turn-1 answer) and to held-out code problems are computed once, then each draft is measured
on them (k=3, 256 new tokens; the 96-token figures come from the same walk, cut shorter).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polyspec.core.acceptance import mal_from_histogram, merge_histograms  # noqa: E402
from polyspec.core.atomic import atomic_write_json, atomic_write_text  # noqa: E402

CODE_HELDOUT_FROM = 64  # HumanEval-XL problems 64..79 are held out in every language
ANSWERS = {"max_new_tokens": 256, "batch_size": 512}
HIDDEN = {"max_batch_tokens": 65536, "batch_size": 64}
FOUNDING = {}  # RunConfig's FitConfig defaults are the founding recipe: 2 epochs, lr 6e-5, 120 warm-up steps
IMPROVED = {"epochs": 4, "lr": 3e-4, "warmup_steps": 20}  # the recipe of the shipped French draft
SCRATCH = {"epochs": 8, "lr": 5e-4, "warmup_steps": 40}  # the recipe of the shipped English base


def _prompts(data: Path, files: list[str], n: int | None, replay: float | None = None, **extra: Any) -> dict:
    out: dict[str, Any] = {"files": [str(data / f) for f in files], "max_prompts": n, "heldout_fraction": 0.02, **extra}
    if replay:
        out["replay"] = [{"path": str(data / "en.jsonl"), "ratio": replay}]
    return out


def run_specs(data: Path, base: Path) -> dict[str, dict[str, Any]]:
    """name -> {config: RunConfig kwargs, reuse: run name or None}."""
    ft = {"mode": "finetune", "parent_draft": str(base)}
    specs: dict[str, dict[str, Any]] = {
        "en-curve": {"language": "en", "mode": "from-scratch", "prompts": _prompts(data, ["en.jsonl", "en_sharegpt.jsonl"], 3000),
                     "vocab": {"draft_vocab_size": 8192, "source": "data"}, "fit": {**SCRATCH, "epochs": 12, "keep_checkpoints": 12}},
        "fr-founding": {"language": "fr", **ft, "prompts": _prompts(data, ["fr.jsonl"], 1200), "fit": FOUNDING},
        "fr-more": {"language": "fr", **ft, "prompts": _prompts(data, ["fr.jsonl"], 2400, replay=0.5), "fit": IMPROVED},
        "fr-more-8ep": {"language": "fr", **ft, "prompts": _prompts(data, ["fr.jsonl"], 2400, replay=0.5),
                        "fit": {**IMPROVED, "epochs": 8}, "reuse": "fr-more"},
        # the founding data with one knob changed at a time: learning rate, then epochs too (fit only: reuse)
        "fr-lr": {"language": "fr", **ft, "prompts": _prompts(data, ["fr.jsonl"], 1200),
                  "fit": {"lr": 3e-4, "warmup_steps": 20}, "reuse": "fr-founding"},
        "fr-8ep": {"language": "fr", **ft, "prompts": _prompts(data, ["fr.jsonl"], 1200),
                   "fit": {**IMPROVED, "epochs": 8}, "reuse": "fr-founding"},
    }
    # a second round on the better English base (en-curve), fit only: the data stages are reused
    curve = {"mode": "finetune", "parent_draft": "/tmp/pshome/runs/en-curve/fit/draft"}
    specs["fr-curve-founding"] = {**specs["fr-founding"], **curve, "reuse": "fr-founding"}
    specs["fr-curve-more-8ep"] = {**specs["fr-more-8ep"], **curve, "reuse": "fr-more"}
    specs["en-big"] = {**specs["en-curve"], "prompts": _prompts(data, ["en.jsonl", "en_sharegpt.jsonl"], 5000)}
    for lang in ("de", "es"):
        specs[f"{lang}-founding"] = {"language": lang, **ft, "prompts": _prompts(data, [f"{lang}.jsonl"], 1200), "fit": FOUNDING}
        specs[f"{lang}-replay"] = {"language": lang, **ft, "prompts": _prompts(data, [f"{lang}.jsonl"], 1200, replay=1.0),
                                   "fit": IMPROVED}
    for lang in ("ru", "zh", "ja"):
        p = _prompts(data, [f"{lang}.jsonl"], 1200, replay=1.0)
        specs[f"{lang}-ft"] = {"language": lang, **ft, "prompts": p, "fit": IMPROVED}
        specs[f"{lang}-scratch"] = {"language": lang, "mode": "from-scratch-custom-vocab", "prompts": p,
                                    "vocab": {"draft_vocab_size": 8192, "source": "data"}, "fit": SCRATCH,
                                    "reuse": f"{lang}-ft"}
    specs["code"] = {"language": "mul", **ft, "prompts": {**_prompts(data, ["code_train.jsonl"], None), "domain": "code",
                                                         "heldout_fraction": 0.0, "min_heldout": 0},
                     "fit": {**IMPROVED, "epochs": 6}}
    return specs


def split_code(src: Path, dst: Path) -> dict[str, int]:
    """code_train.jsonl / code_heldout.jsonl from every language's HumanEval-XL prompts, split by problem."""
    train, held = [], []
    for path in sorted(src.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").split("\n"):
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("domain") != "code":
                continue
            (held if int(rec["id"].rsplit("-", 1)[1]) >= CODE_HELDOUT_FROM else train).append(line)
    atomic_write_text(dst / "code_train.jsonl", "\n".join(train) + "\n")
    atomic_write_text(dst / "code_heldout.jsonl", "\n".join(held) + "\n")
    return {"train": len(train), "heldout": len(held)}


def train(names: list[str], data: Path, base: Path, home: Path, report: Path) -> None:
    specs = run_specs(data, base)
    failed = []
    for name in names:
        try:
            _train_one(name, dict(specs[name]), data, home, report)
        except Exception as exc:  # noqa: BLE001 - a failed run is reported; the runs after it still train
            failed.append(name)
            _merge_json(report, {name: {"error": repr(exc)}})
            print(f"{name}: FAILED {exc!r}", flush=True)
    if failed:
        raise SystemExit(f"failed runs: {', '.join(failed)}")


def _train_one(name: str, spec: dict[str, Any], data: Path, home: Path, report: Path) -> None:
    from polyspec.training.config import RunConfig
    from polyspec.training.pipeline import run_pipeline, start_run
    from polyspec.training.runs import Run, reuse_stages

    reuse = spec.pop("reuse", None)
    cfg = RunConfig(run_id=name, verifier=os.environ.get("FX_VERIFIER", "smollm2-135m-instruct"), seed=0,
                    device="cuda", answers=ANSWERS, hidden=HIDDEN, registration={"enabled": False}, **spec)
    run = start_run(cfg, home=home, resume=True)
    if reuse:
        reuse_stages(run, Run.open(reuse, home))
    started = time.time()
    run_pipeline(run, stages=["prompts", "answers", "hidden-states", "vocab", "fit"], home=home)
    stages = {s: (run.marker(s) or {}).get("seconds") for s in ("prompts", "answers", "hidden-states", "vocab", "fit")}
    summaries = {s: run.summary(s) for s in ("prompts", "answers", "fit")}
    entry = {"seconds": round(time.time() - started, 1), "stages": stages, "summaries": summaries, "reused_from": reuse,
             "config": json.loads(cfg.model_dump_json())}
    _merge_json(report, {name: entry})


def _merge_json(path: Path, update: dict) -> None:
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(update)
    atomic_write_json(path, old, indent=1)


def eval_items(benches: list[str], code_heldout: Path | None) -> dict[str, list[Any]]:
    """group -> benchmark items: every turn of each benchmark file per language (mt-LANG), and held-out code
    problems per language (code-LANG). Languages come from the files: their `lang` fields."""
    from polyspec.training.benchmarks import load_benchmark

    limit = int(os.environ["FX_LIMIT"]) if os.environ.get("FX_LIMIT") else None  # smoke runs on CPU
    groups: dict[str, list[Any]] = {}
    for bench in benches:
        for item in load_benchmark(bench, "all", limit=limit):
            groups.setdefault(f"mt-{item.language or 'und'}", []).append(item)
    if code_heldout is not None:
        for item in load_benchmark(code_heldout, "1"):
            group = groups.setdefault(f"code-{item.language or 'und'}", [])
            if limit is None or len(group) < limit:
                group.append(item)
    return groups


def evaluate(drafts: dict[str, Path], verifier_spec: str, code_heldout: Path | None, out: Path,
             checkpoints: dict[str, Path] | None = None, wait_until: float = 0.0, benches: list[str] | None = None) -> None:
    """Per-prompt histograms of every draft on every group, at 256 and 96 new tokens (training.eval_offline)."""
    from polyspec.models.verifiers import resolve_verifier
    from polyspec.training.benchmarks import mtbench_languages
    from polyspec.training.eval_options import EvalOptions
    from polyspec.training.eval_offline import OfflineScorer, aux_layers

    verifier = resolve_verifier(verifier_spec)
    while not any(_ready(p) for p in drafts.values()) and time.time() < wait_until:
        time.sleep(5)  # the aux layers come from a draft's config: wait for the first one to be saved
    first = next((p for p in drafts.values() if _ready(p)), next(iter(drafts.values())))
    groups = eval_items(benches or [f"mtbench:{lang}" for lang in mtbench_languages()], code_heldout)
    flat = [(g, it) for g, items in groups.items() for it in items]
    options = EvalOptions(k=3, max_new_tokens=256, device=os.environ.get("FX_DEVICE", "cuda"), batch_size=512)
    from polyspec.training.eval_options import DraftChoice

    scorer = OfflineScorer(verifier, [it for _, it in flat], options, aux_layers([DraftChoice("first", first)], verifier.path))
    idx = {g: [n for n, (gg, _) in enumerate(flat) if gg == g] for g in groups}
    result: dict[str, Any] = {"trajectory_seconds": scorer.seconds["answers"], "groups": {
        g: {"ids": [flat[n][1].key for n in ns], "mismatches": sum(scorer.trajectory(n).mismatches for n in ns),
            "tokens": sum(len(scorer.trajectory(n).token_ids) - scorer.trajectory(n).prompt_len for n in ns),
            "answer_token_counts": _answer_counts([scorer.trajectory(n) for n in ns])} for g, ns in idx.items()},
        "drafts": {}}
    atomic_write_json(out, result, indent=None)
    pending = {**drafts, **(checkpoints or {})}
    while pending:
        # drafts still training elsewhere are measured as they appear (saved atomically), in the given order
        ready = [n for n, p in pending.items() if _ready(p) or time.time() >= wait_until]
        if not ready:
            time.sleep(5)
            continue
        name = ready[0]
        path = pending.pop(name)
        t1 = time.time()
        try:
            details = scorer.score(_load(path, verifier.path))
        except Exception as exc:  # noqa: BLE001 - one broken draft must not lose the others' figures
            result["drafts"][name] = {"path": str(path), "error": repr(exc)}
            print(f"{name}: FAILED {exc!r}", flush=True)
            continue
        keep = [g for g in groups if not name.startswith("ckpt:") or g in ("mt-en", "mt-fr")]
        per = {g: {"hist": [details[n].histogram for n in idx[g]], "hist96": [_cut(details[n], 96) for n in idx[g]]}
               for g in keep}
        result["drafts"][name] = {"path": str(path), "seconds": round(time.time() - t1, 1), "groups": per}
        atomic_write_json(out, result, indent=None)
        print(f"{name}: {time.time() - t1:.1f}s", flush=True)
    atomic_write_json(out, result, indent=None)


def _ready(path: Path) -> bool:
    return path.is_file() if path.name == "state.pt" else (path / "model.safetensors").is_file()


def _answer_counts(trajs: list[Any]) -> dict[int, int]:
    """How often each token id occurs in the verifier's answers (for draft-vocabulary coverage)."""
    from collections import Counter

    return dict(Counter(tok for t in trajs for tok in t.token_ids[t.prompt_len :]))


def _cut(detail: Any, budget: int) -> list[int]:
    """The histogram of the first steps whose tokens fit a smaller budget (the walk is the same)."""
    hist, produced = [0] * (len(detail.histogram)), 1
    for _, _, a in detail.steps:
        if produced >= budget:
            break
        hist[a] += 1
        produced += a + 1
    return hist


def pooled_mal(hists: list[list[int]]) -> float | None:
    """Mean acceptance length pooled over prompts (core.acceptance; None when no step was taken)."""
    return mal_from_histogram(merge_histograms(hists)) if hists else None


def pick(evals: list[Path], data: Path, base: Path) -> list[str]:
    """The best trained run per target language (on its MT-Bench turns) and the code run, French first;
    only runs that beat the base draft where they are meant to."""
    specs = run_specs(data, base)
    drafts: dict[str, Any] = {}
    for path in evals:
        drafts.update({n: d for n, d in json.loads(path.read_text())["drafts"].items() if "groups" in d})
    mal = {n: {g: pooled_mal(v["hist"]) or 0.0 for g, v in d["groups"].items()} for n, d in drafts.items()}
    chosen: list[str] = []
    langs = list(dict.fromkeys(spec["language"] for spec in specs.values() if spec["language"] != "en"))
    for lang in sorted(langs, key=lambda x: (x != "fr", x == "mul")):  # French first, the code draft last
        def score(n: str, group: str = f"mt-{lang}", code: bool = lang == "mul") -> float:
            return _mean([v for g, v in mal[n].items() if g.startswith("code-")]) if code else mal[n].get(group, 0.0)

        runs = [n for n, spec in specs.items() if spec["language"] == lang and n in mal]
        if not runs or "base" not in mal:
            continue
        best = max(runs, key=score)
        if score(best) > score("base"):
            chosen.append(best)
    return chosen


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _load(path: Path, verifier_path: Path) -> Any:
    """A saved draft dir, or an end-of-epoch checkpoint (state.pt) applied to its run's initial draft."""
    import torch

    from polyspec.models.draft_build import load_draft

    if path.name == "state.pt":
        init = path.parents[3] / "vocab" / "init_draft"  # RUN/fit/checkpoints/epoch-N/state.pt
        draft = load_draft(init, verifier_path)
        draft.load_state_dict(torch.load(path, map_location="cpu", weights_only=False)["model"], strict=False)
        return draft
    return load_draft(path, verifier_path)


def main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data")
    d.add_argument("src", type=Path)
    d.add_argument("dst", type=Path)
    t = sub.add_parser("train")
    t.add_argument("--runs", required=True)
    t.add_argument("--data", type=Path, required=True)
    t.add_argument("--base", type=Path, required=True)
    t.add_argument("--home", type=Path, default=Path(os.environ.get("POLYSPEC_HOME", "~/.cache/polyspec")).expanduser())
    t.add_argument("--report", type=Path, required=True)
    e = sub.add_parser("evaluate")
    e.add_argument("--drafts", required=True, help="NAME=DIR,...")
    e.add_argument("--checkpoints", default="", help="NAME=state.pt,... (evaluated on mt-en and mt-fr only)")
    e.add_argument("--code-heldout", type=Path)
    e.add_argument("--bench", action="append", help="benchmark file or mtbench:LANG (repeat); default: every bundled one")
    e.add_argument("--verifier", default="smollm2-135m-instruct")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--wait", type=float, default=0.0, help="seconds to wait for drafts still being trained")
    k = sub.add_parser("pick", help="print the runs worth shipping, one per line")
    k.add_argument("evals", type=Path, nargs="+")
    k.add_argument("--data", type=Path, required=True)
    k.add_argument("--base", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "data":
        print(split_code(args.src, args.dst))
    elif args.cmd == "pick":
        print("\n".join(pick(args.evals, args.data, args.base)))
    elif args.cmd == "train":
        train(args.runs.split(","), args.data, args.base, args.home, args.report)
    else:
        pairs = lambda s: {k: Path(v) for k, v in (x.split("=", 1) for x in s.split(",") if x)}  # noqa: E731
        evaluate(pairs(args.drafts), args.verifier, args.code_heldout, args.out, pairs(args.checkpoints),
                 wait_until=time.time() + args.wait, benches=args.bench)


if __name__ == "__main__":
    main(sys.argv[1:])
