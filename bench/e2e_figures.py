"""The figures of bench/e2e_speedup.py from its per-request rows: per-cell aggregates (tokens/s, acceptance,
time per engine step), paired tokens/s ratios with bootstrap intervals, break-even acceptance lengths,
and their table and plot. Pure functions (no servers), so tests can check them on made-up rows."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import MIN_INTERVAL_PROMPTS, interval_text, save_figure
from polyspec.core.acceptance import mal_from_histogram, merge_histograms, positions_from_histogram

console = Console(width=160)
LANGS = ("fr", "en")
SYSTEMS = ("fr_draft", "en_draft", "no_spec")
LABELS = {"fr_draft": "French draft", "en_draft": "English draft", "no_spec": "no speculation"}
# Which router serves each (traffic language, system) cell, and which deployment must answer it.
PLAN = {"fr": {"fr_draft": "routed", "en_draft": "en_only", "no_spec": "no_spec"},
        "en": {"en_draft": "routed", "fr_draft": "fr_only", "no_spec": "no_spec"}}


def summarize(rows: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """Aggregate one (system, language) cell: tokens/s, acceptance per position, MAL, time per step."""
    ok = [r for r in rows if r["ok"]]
    tokens, seconds = sum(r["tokens"] for r in ok), sum(r["seconds"] for r in ok)
    hist = merge_histograms([[*r["histogram"][: k + 1], *[0] * (k + 1 - len(r["histogram"]))] for r in ok]) if ok \
        else [0] * (k + 1)
    steps = sum(hist)
    mal = mal_from_histogram(hist)
    spec_steps = sum(r["spec_steps"] for r in ok)
    # Engine forward steps: one prefill per request, then one per spec step (or per token without a draft).
    decode_steps = spec_steps if steps else tokens - len(ok)
    forward_steps = len(ok) + decode_steps
    per_request = sorted(r["tokens"] / r["seconds"] for r in ok if r["seconds"])
    return {
        "requests": len(rows), "errors": len(rows) - len(ok), "misrouted": sum(r["misrouted"] for r in rows),
        "completion_tokens": tokens, "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 3) if seconds else 0.0,
        "tokens_per_s_median_request": round(per_request[len(per_request) // 2], 3) if per_request else None,
        "acceptance_histogram": hist if steps else None,
        "acceptance_per_position": [round(p, 4) for p in positions_from_histogram(hist)] if steps else None,
        "mean_acceptance_length": round(mal, 3) if mal is not None else None,
        "engine_steps": forward_steps,
        "ms_per_engine_step": round(1000 * seconds / forward_steps, 1) if forward_steps else None,
        "backends": {b: sum(r["backend"] == b for r in rows) for b in sorted({r["backend"] for r in rows})},
    }


def _paired(rows: list[dict[str, Any]], lang: str, num: str, den: str) -> list[tuple[float, float, float, float]]:
    """Per prompt (passes summed): (tokens, seconds) of ``num`` and of ``den``, for prompts both answered."""
    sums: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if r["language"] == lang and r["ok"] and r["system"] in (num, den):
            cell = sums.setdefault(r["prompt_id"], {}).setdefault(r["system"], [0.0, 0.0])
            cell[0] += r["tokens"]
            cell[1] += r["seconds"]
    return [(p[num][0], p[num][1], p[den][0], p[den][1]) for p in sums.values() if num in p and den in p]


def _ratio(pairs: list[tuple[float, float, float, float]]) -> float:
    return (sum(p[0] for p in pairs) / sum(p[1] for p in pairs)) / (sum(p[2] for p in pairs) / sum(p[3] for p in pairs))


def ratio_ci(rows: list[dict[str, Any]], lang: str, num: str, den: str, n_boot: int = 2000,
             seed: int = 0) -> dict[str, Any]:
    """tokens/s ratio of two systems on one language, with a 95% bootstrap interval over prompts (paired)
    and, when there are several passes, the ratio of each pass."""
    pairs = _paired(rows, lang, num, den)
    if not pairs:
        return {"ratio": None, "prompts": 0}
    per_prompt = sorted((a / s) / (b / t) for a, s, b, t in pairs if s and t and b)
    out = {"ratio": round(_ratio(pairs), 3), "ci95": None,
           "per_prompt_median": round(per_prompt[len(per_prompt) // 2], 3), "prompts": len(pairs)}
    if len(pairs) >= MIN_INTERVAL_PROMPTS:
        rng = random.Random(seed)
        boots = sorted(_ratio([rng.choice(pairs) for _ in pairs]) for _ in range(n_boot))
        out["ci95"] = [round(boots[int(0.025 * n_boot)], 3), round(boots[int(0.975 * n_boot) - 1], 3)]
    passes = sorted({r.get("repeat", 0) for r in rows})
    if len(passes) > 1:
        per_pass = [_paired([r for r in rows if r.get("repeat", 0) == p], lang, num, den) for p in passes]
        out["per_pass"] = [round(_ratio(pp), 3) if pp else None for pp in per_pass]
    return out


def identical_outputs(rows: list[dict[str, Any]], lang: str) -> dict[str, int]:
    """Greedy speculation should not change the text: prompts where all three systems wrote the same."""
    by: dict[str, set[str]] = {}
    for r in rows:
        if r["language"] == lang and r["ok"]:
            by.setdefault(r["prompt_id"], set()).add(r["text_sha1"])
    return {"prompts": len(by), "identical": sum(len(s) == 1 for s in by.values())}


def headline_figures(rows: list[dict[str, Any]], results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "fr_traffic_french_draft_over_english_draft": ratio_ci(rows, "fr", "fr_draft", "en_draft"),
        "fr_traffic_french_draft_over_no_spec": ratio_ci(rows, "fr", "fr_draft", "no_spec"),
        "fr_traffic_english_draft_over_no_spec": ratio_ci(rows, "fr", "en_draft", "no_spec"),
        "en_traffic_english_draft_over_french_draft": ratio_ci(rows, "en", "en_draft", "fr_draft"),
        "en_traffic_english_draft_over_no_spec": ratio_ci(rows, "en", "en_draft", "no_spec"),
        "en_traffic_french_draft_over_no_spec": ratio_ci(rows, "en", "fr_draft", "no_spec"),
    }
    # Both drafts have the same architecture and vocabulary, so a step costs them the same: the ratio of engine
    # steps for the same text is the speed-up with timing noise taken out (outputs are identical, greedy).
    for name, lang in (("fr_traffic_french_draft_over_english_draft", "fr"),
                       ("en_traffic_english_draft_over_french_draft", "en")):
        num, den = ("fr_draft", "en_draft") if lang == "fr" else ("en_draft", "fr_draft")
        steps_num, steps_den = results[num][lang]["engine_steps"], results[den][lang]["engine_steps"]
        out[name]["engine_step_ratio"] = round(steps_den / steps_num, 3) if steps_num else None
    # Speculation pays when MAL > (time of a speculative step) / (time of a plain step), both measured here.
    plain = [results["no_spec"][lang]["ms_per_engine_step"] for lang in LANGS]
    plain_ms = sum(plain) / len(plain) if all(plain) else None
    out["break_even"] = {
        f"{system}_{lang}": {"ms_per_step": results[system][lang]["ms_per_engine_step"],
                             "plain_ms_per_step": plain_ms,
                             "break_even_mal": round(results[system][lang]["ms_per_engine_step"] / plain_ms, 3)
                             if plain_ms and results[system][lang]["ms_per_engine_step"] else None,
                             "measured_mal": results[system][lang]["mean_acceptance_length"]}
        for system in ("fr_draft", "en_draft") for lang in LANGS}
    return out


def print_results(results: dict[str, Any], headline: dict[str, Any], validation_only: bool) -> None:
    title = "End-to-end tokens/s and acceptance" + (" (UNTRAINED drafts: mechanics check, not a result)"
                                                    if validation_only else "")
    table = Table(title=title)
    cols = ("traffic", "system", "router", "requests", "errors", "misrouted", "tokens", "tokens/s", "vs no-spec",
            "pos 1", "pos 2", "pos 3", "MAL", "ms/step", "break-even MAL")
    for col in cols:
        table.add_column(col, justify="left" if col in ("traffic", "system", "router") else "right")
    for lang in LANGS:
        base = results["no_spec"][lang]["tokens_per_s"]
        for system in SYSTEMS:
            r = results[system][lang]
            acc = r["acceptance_per_position"] or ["–"] * 3
            be = headline["break_even"].get(f"{system}_{lang}", {}).get("break_even_mal", "–")
            table.add_row(lang, LABELS[system], PLAN[lang][system], str(r["requests"]), str(r["errors"]),
                          str(r["misrouted"]), str(r["completion_tokens"]), f"{r['tokens_per_s']:.2f}",
                          f"{r['tokens_per_s'] / base:.3f}" if base else "–", *[str(a) for a in acc[:3]],
                          str(r["mean_acceptance_length"] or "–"), str(r["ms_per_engine_step"]), str(be))
    console.print(table)
    ratios = Table(title="tokens/s ratios (95% bootstrap interval over prompts, paired)")
    for col in ("ratio", "value", "95% interval", "per pass", "per-prompt median", "prompts", "engine-step ratio"):
        ratios.add_column(col, justify="left" if col == "ratio" else "right")
    for name, r in headline.items():
        if name != "break_even" and r.get("ratio") is not None:
            ratios.add_row(name, f"{r['ratio']:.3f}", interval_text(r["ci95"], r["prompts"]),
                           " / ".join(str(x) for x in r.get("per_pass", [])) or "–",
                           f"{r['per_prompt_median']:.3f}", str(r["prompts"]), str(r.get("engine_step_ratio", "–")))
    console.print(ratios)


def plot(results: dict[str, Any], headline: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.26
    colors = {"fr_draft": "#1f77b4", "en_draft": "#ff7f0e", "no_spec": "#7f7f7f"}
    for j, system in enumerate(SYSTEMS):
        xs = [i + (j - 1) * width for i in range(len(LANGS))]
        ys = [results[system][lang]["tokens_per_s"] for lang in LANGS]
        ax1.bar(xs, ys, width, label=LABELS[system], color=colors[system])
        for x, y in zip(xs, ys):
            ax1.text(x, y, f"{y:.1f}", ha="center", va="bottom", fontsize=8)
    ax1.set_xticks(range(len(LANGS)), [f"{lang} traffic" for lang in LANGS])
    ax1.set_ylabel("generated tokens/s (one stream)")
    head = headline["fr_traffic_french_draft_over_english_draft"]
    ax1.set_title(f"tokens/s; fr: French/English draft = {head['ratio']}" if head.get("ratio") else "tokens/s")
    ax1.legend(fontsize=8)
    for system, style in (("fr_draft", "-"), ("en_draft", "--")):
        for lang, marker in (("fr", "o"), ("en", "s")):
            acc = results[system][lang]["acceptance_per_position"]
            if acc:
                mal = results[system][lang]["mean_acceptance_length"]
                ax2.plot(range(1, len(acc) + 1), acc, style, marker=marker, color=colors[system],
                         label=f"{LABELS[system]}, {lang} traffic (MAL {mal})")
    ax2.set_xlabel("draft position")
    ax2.set_ylabel("acceptance (share of steps)")
    ax2.set_xticks([1, 2, 3])
    ax2.set_ylim(0, None)
    ax2.set_title("acceptance per position")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
