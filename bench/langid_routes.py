"""What bench/langid.py reports about routing short prompts: first-two-word accuracy per source and language,
the cost of a wrong label in tokens/s, and language ID's time per call before and after a change.

- **First two words.** Each prompt cut to its first two words (zh, ja: 4 characters, th: 8), per source:
  MT-Bench (the evaluation set: every turn) and the held-out sample of the data pack's train/more (never
  used to choose a constant), gettext catalogs apart. Accuracy over distinct cuts (a cut repeated within a
  language counts once, as in the rest of the bench) and over prompts (each prompt counts). Targets: 92 %
  overall and 80 % in every language, on MT-Bench and on the held-out train sample.
- **Cost of a wrong label.** The speed model (`core.speed`): a request in language L yields
  ``E_3(draft, L) / step_s`` tokens/s, E from the shipped drafts' MT-Bench-160 evaluations (k = 3,
  models/drafts/manifest.json; a draft with no figure on L accepts nothing, E = 1, as the router assumes)
  and step_s the calibrated step of the k = 3 drafts' engine shape in docs/benchmarks/speed_policy.json. For
  each fleet, the right draft is the one the fleet serves L with, the wrong one the draft the wrong label
  picks; the labels and their shares come from the first-two-word run.
- **Time per call.** CPU time of `detect_cleaned` on the held-out cuts, one call at a time as the router calls it, in
  separate processes for this tree and for a git ref (``--micro-before REF``: its core/ is unpacked and
  imported in place of this one), in alternating rounds; the median round.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"overall": 0.92, "min_language": 0.80}
TARGET_SOURCES = ("mtbench", "more")  # the evaluation set and the held-out train sample
SOURCE_NAMES = {"mtbench": "MT-Bench (eval)", "more": "train pack, held-out sample", "gettext": "gettext catalogs"}
MANIFEST = ROOT / "models" / "drafts" / "manifest.json"
SPEED_JSON = ROOT / "docs" / "benchmarks" / "speed_policy.json"
K = 3
MICRO_CUTS = ("2w", "5w", "sentences")


def _score(pairs: list[tuple[str, str]], detect: Callable[[str], Any]) -> tuple[dict[str, float], Counter[tuple[str, str]]]:
    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    labels: Counter[tuple[str, str]] = Counter()
    for lang, text in pairs:
        got = detect(text).language
        hits[lang][0] += int(got == lang)
        hits[lang][1] += 1
        labels[(lang, got)] += 1
    out = {lang: round(h / n, 4) for lang, (h, n) in sorted(hits.items())}
    total = sum(n for _, n in hits.values())
    summary = {"all": round(sum(h for h, _ in hits.values()) / max(1, total), 4),
               "min": min(out.values(), default=0.0), "n": total}
    return out | summary, labels


def first_two_words(rows: list[tuple[str, str, str]], cut: Callable[[str, str], str],
                    detect: dict[str, Callable[[str], Any]]) -> tuple[dict[str, Any], dict[str, Counter[str]]]:
    """Per source and mode (``detect``: mode -> function of cleaned text): accuracy per language over distinct
    cuts and over prompts, with the overall and the lowest. Also, per true language, the labels given (the
    unrestricted run over distinct cuts of the target sources), for the wrong-label cost."""
    by_source: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for lang, source, text in rows:
        short = cut(text, lang)
        if short:
            by_source[source.removesuffix("-tuning")].append((lang, short))
    out: dict[str, Any] = {}
    confusion: dict[str, Counter[str]] = defaultdict(Counter)
    for source, pairs in sorted(by_source.items()):
        distinct = list(dict.fromkeys(pairs))
        for mode, fn in detect.items():
            acc, labels = _score(distinct, fn)
            per_prompt, _ = _score(pairs, fn)
            met = acc["all"] >= TARGETS["overall"] and acc["min"] >= TARGETS["min_language"]
            out.setdefault(source, {})[mode] = {"distinct": acc, "prompts": per_prompt, "target_met": met}
            if mode == "unrestricted" and source in TARGET_SOURCES:
                for (lang, got), n in labels.items():
                    confusion[lang][got] += n
    return out, confusion


def _acceptance(manifest: dict[str, Any]) -> tuple[dict[str, dict[str, float]], dict[str, str], str]:
    """E_3 per draft and language; the draft made for each language (made for it alone, else a multilingual
    draft made for it among others); the base draft."""
    from polyspec.core.speed import expected_tokens

    expected: dict[str, dict[str, float]] = {}
    made_for: dict[str, str] = {}
    base = ""
    for draft in sorted(manifest["drafts"], key=lambda d: len(d["languages"])):  # drafts made for one first
        name = draft["name"]
        for lang in draft["languages"]:
            made_for.setdefault(lang, name)
        if draft.get("role") == "base":
            base = name
        for ev in draft["evaluations"]:
            if ev.get("benchmark") == "mtbench-160" and ev.get("k") == K and ev.get("subset") == "all":
                expected.setdefault(name, {})[ev["language"]] = expected_tokens(ev["acceptance"], K)
    return expected, made_for, base


def wrong_label_cost(confusion: dict[str, Counter[str]], manifest_path: Path = MANIFEST,
                     speed_path: Path = SPEED_JSON) -> dict[str, Any]:
    """Per language with evaluations and per fleet: tokens/s on the right draft and on the draft each wrong
    label picks (the speed model), and the expected loss per request at the measured label shares."""
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    steps = json.loads(speed_path.read_text(encoding="utf-8"))["engine_steps"]
    step_s = statistics.median(v["shared_step_s"] for lang, v in steps.items() if lang != "plain")
    expected, made_for, base = _acceptance(manifest)
    evaluated = sorted({lang for figures in expected.values() for lang in figures})

    def e(draft: str, lang: str) -> float:
        return expected.get(draft, {}).get(lang, 1.0)

    fleets = {
        "specialist": {lang: made_for.get(lang, base) for lang in evaluated},  # one draft per language
        "best_draft": {lang: max(expected, key=lambda d, lang=lang: e(d, lang)) for lang in evaluated},
    }
    out: dict[str, Any] = {"step_s": step_s, "k": K, "fleets": fleets, "languages": {}}
    for lang in evaluated:
        labels = confusion.get(lang, Counter())
        total = sum(labels.values())
        row: dict[str, Any] = {"n": total}
        for fleet, serves in fleets.items():
            right = serves[lang]
            wrong = {}
            for label, n in labels.most_common():
                if label == lang:
                    continue
                picked = serves.get(label, base)
                wrong[label] = {"share": round(n / total, 4), "draft": picked,
                                "tps": round(e(picked, lang) / step_s, 2),
                                "cost_tps": round((e(right, lang) - e(picked, lang)) / step_s, 2)}
            row[fleet] = {"draft": right, "tps": round(e(right, lang) / step_s, 2), "wrong": wrong,
                          "expected_loss_tps": round(sum(w["share"] * w["cost_tps"] for w in wrong.values()), 3),
                          "worst_cost_tps": max((w["cost_tps"] for w in wrong.values()), default=0.0)}
        out["languages"][lang] = row
    return out


def _load_core(core_dir: str | None) -> Any:
    """core.langid from ``core_dir`` (an unpacked older core/) or this tree's."""
    if core_dir:
        import importlib.util

        import polyspec

        spec = importlib.util.spec_from_file_location("polyspec.core", Path(core_dir) / "__init__.py",
                                                      submodule_search_locations=[core_dir])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["polyspec.core"] = module
        polyspec.core = module  # type: ignore[attr-defined]
        spec.loader.exec_module(module)
    from polyspec.core import langid

    return langid


def _time_calls(texts_path: str, core_dir: str | None) -> dict[str, dict[str, float]]:
    """CPU microseconds per `detect_cleaned` call on each set of texts, restricted and not (one round): the
    process's CPU time, which other jobs on a shared machine disturb less than wall time does."""
    langid = _load_core(core_dir)
    payload = json.loads(Path(texts_path).read_text(encoding="utf-8"))
    labels = langid.allowed_labels(payload["restrict"])
    langid.warm_up(labels)
    sets: dict[str, list[str]] = payload["sets"]
    out: dict[str, dict[str, float]] = {}
    for mode, allowed in (("restricted", labels), ("unrestricted", None)):
        for texts in sets.values():  # load every model first: not timed
            for text in texts:
                langid.detect_cleaned(text, allowed)
        for name, texts in sets.items():
            start = time.process_time()
            for text in texts:
                langid.detect_cleaned(text, allowed)
            out.setdefault(mode, {})[name] = round(1e6 * (time.process_time() - start) / max(1, len(texts)), 2)
    return out


def _unpack_core(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "core"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "core"


def per_call_us(cuts: dict[str, list[tuple[str, str]]], restrict: list[str], rounds: int,
                before: str | None = None) -> dict[str, Any]:
    """Median microseconds per call over ``rounds``, each tree in its own process per round, in turns."""
    import random

    sets = {c: [t for _, t in cuts[c]] for c in MICRO_CUTS}
    sets["mixed"] = [t for c in MICRO_CUTS for t in sets[c]]
    random.Random("langid-micro").shuffle(sets["mixed"])
    results: dict[str, list[dict[str, dict[str, float]]]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        texts = Path(tmp) / "texts.json"
        texts.write_text(json.dumps({"restrict": restrict, "sets": sets}), encoding="utf-8")
        trees = {"now": ""}
        if before:
            trees["before"] = str(_unpack_core(before, Path(tmp)))
        for r in range(rounds):
            order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
            for name, core_dir in order:
                done = subprocess.run([sys.executable, "-m", "bench.langid_routes", texts.as_posix(), core_dir],
                                      check=True, capture_output=True, text=True, cwd=ROOT)
                results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    out: dict[str, Any] = {"rounds": rounds, "restrict": restrict, "texts": {k: len(v) for k, v in sets.items()},
                           "before_ref": before}
    for name, runs in results.items():
        out[name] = {mode: {s: round(statistics.median(run[mode][s] for run in runs), 2) for s in sets}
                     for mode in runs[0]}
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def markdown(d: dict[str, Any]) -> list[str]:
    """The LID figures docs/languages.md quotes, from langid.json."""
    two, t = d["first_two_words"], d["first_two_words_targets"]
    lines = [f"First two words (zh, ja: 4 characters; th: 8), this detector, distinct cuts; targets {_pct(t['overall'])} "
             f"overall and {_pct(t['min_language'])} in every language, on the first two sources:", "",
             "| source | mode | overall | lowest language | per prompt | target | per language |", "|---|---|---:|---:|---:|---|---|"]
    for source, modes in two.items():
        for mode, r in modes.items():
            acc = r["distinct"]
            per = ", ".join(f"{lang} {100 * v:.0f}" for lang, v in acc.items() if lang not in ("all", "min", "n"))
            low = min((v, lang) for lang, v in acc.items() if lang not in ("all", "min", "n"))
            met = ("met" if r["target_met"] else "not met") if source in TARGET_SOURCES else "(reported)"
            lines.append(f"| {SOURCE_NAMES.get(source, source)} | {mode} | {_pct(acc['all'])} ({acc['n']}) | "
                         f"{low[1]} {_pct(low[0])} | {_pct(r['prompts']['all'])} | {met} | {per} |")
    c = d["wrong_label_cost"]
    lines += ["", f"Cost of a wrong label, tokens/s of one stream (speed model, k = {c['k']}, step {c['step_s']:.4f} s; "
              "`specialist`: each language's own draft, English's base for the others; `best_draft`: the "
              "shipped draft with the highest acceptance on each language):", "",
              "| language | fleet | right draft | tokens/s | commonest wrong label: draft, tokens/s (cost) | worst cost | "
              "expected loss per request |", "|---|---|---|---:|---|---:|---:|"]
    for lang, row in c["languages"].items():
        for fleet in c["fleets"]:
            f = row[fleet]
            top = next(iter(f["wrong"].items()), None)
            wrong = (f"{top[0]} ({_pct(top[1]['share'])}): {top[1]['draft']}, {top[1]['tps']:.2f} ({top[1]['cost_tps']:+.2f})"
                     if top else "none")
            lines.append(f"| {lang} | {fleet} | {f['draft']} | {f['tps']:.2f} | {wrong} | {f['worst_cost_tps']:.2f} | "
                         f"{f['expected_loss_tps']:.3f} |")
    m = d["per_call_us"]
    lines += ["", f"CPU time per `detect_cleaned` call, µs (median of {m['rounds']} rounds, restricted to {len(m['restrict'])} "
              f"languages as a router is, and unrestricted; before: {m['before_ref'] or 'not timed'}):", "",
              "| texts | " + " | ".join(f"{tree} {mode}" for tree in ("before", "now") if tree in m
                                         for mode in ("restricted", "unrestricted")) + " |",
              "|---|" + "---:|" * (2 * sum(1 for tree in ("before", "now") if tree in m))]
    for name, n in m["texts"].items():
        cells = [f"{m[tree][mode][name]:.1f}" for tree in ("before", "now") if tree in m for mode in ("restricted", "unrestricted")]
        lines.append(f"| {name} ({n}) | " + " | ".join(cells) + " |")
    return lines


DOC = ROOT / "docs" / "languages.md"
BEGIN = "<!-- langid figures: generated by .venv/bin/python bench/langid_routes.py --docs; do not edit until the end mark -->"
END = "<!-- end of langid figures -->"


def write_docs(source: Path = ROOT / "docs" / "benchmarks" / "langid.json", page: Path = DOC) -> None:
    """Replace the generated block of ``page`` with the figures of ``source``."""
    from polyspec.core.atomic import atomic_write_text

    text = page.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{page} has no generated block ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    block = "\n".join([BEGIN, "", *markdown(json.loads(source.read_text(encoding="utf-8"))), "", END])
    atomic_write_text(page, head + block + rest.split(END, 1)[1])


def print_tables(console: Any, d: dict[str, Any]) -> None:
    for line in markdown(d):
        console.print(line, markup=False, highlight=False)


if __name__ == "__main__":
    if sys.argv[1:] == ["--docs"]:
        write_docs()
    else:  # one timing round in a fresh process: texts.json [core_dir]
        print(json.dumps(_time_calls(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)))
