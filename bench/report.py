"""Markdown tables for docs/benchmarks.md from the JSON results (so the doc quotes measured numbers).

    .venv/bin/python bench/report.py router_overhead.json
    .venv/bin/python bench/report.py load.json
    .venv/bin/python bench/report.py e2e_speedup.json
    .venv/bin/python bench/report.py hostile.json
    .venv/bin/python bench/report.py langid.json
    .venv/bin/python bench/report.py speed_policy.json
    .venv/bin/python bench/report.py router_budget.json
    .venv/bin/python bench/report.py router_ab        # every bench/router_ab.py run
    .venv/bin/python bench/report.py server_floor.json
    .venv/bin/python bench/report.py fleet_plan.json  # bench/fleet_figures.fleet_plan_md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import interval_text  # noqa: E402
from bench.router_overhead import CPU_RATIO_TARGET, FLOOR_EXCESS_TARGET_MS, router_targets  # noqa: E402
from bench.fleet_figures import fleet_plan_md  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
SYSTEMS = ["direct", "polyspec", "polyspec_base", "python_floor", "litellm", "vllm_router"]


def overhead_md(d: dict[str, Any]) -> str:
    lines = []
    for mode in ("non-stream", "stream"):
        lines += [f"**{mode}**", "",
                  "| conc | system | p50 ms | p99 ms | +p50 vs direct | +p99 vs direct | TTFB p50 ms | req/s | router CPU ms/req | RSS MiB | errors |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for conc, by in d["concurrency"].items():
            base = by["direct"] if mode == "non-stream" else by["direct"]["stream"]
            for name in SYSTEMS:
                if name not in by:
                    continue
                s = by[name] if mode == "non-stream" else by[name]["stream"]
                lines.append(f"| {conc} | {name} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | {s['p50_ms'] - base['p50_ms']:+.2f} | "
                             f"{s['p99_ms'] - base['p99_ms']:+.2f} | {s['ttfb_p50_ms']:.2f} | {s['rps']:.0f} | "
                             f"{s.get('cpu_ms_per_req', '–')} | {s.get('rss_mb', '–')} | {s['errors']} |")
        lines.append("")
    lines += _floor_md(d)
    lines += ["Targets (reported, not asserted): `" + json.dumps(d["targets"]) + "`", ""]
    prof = d.get("profile")
    if prof:
        lines += [f"Profile of polyspec at concurrency {prof['concurrency']} (half streamed), {prof['samples']} samples, "
                  f"{prof['tool']}:", "", "| component (inclusive) | share |", "|---|---:|"]
        lines += [f"| {r['function']} | {100 * r['share']:.1f}% |" for r in prof.get("components", [])]
        lines += ["", "| top self time | share |", "|---|---:|"]
        lines += [f"| `{r['function']}` | {100 * r['share']:.1f}% |" for r in prof["self"][:12]]
    return "\n".join(lines)


def _floor_md(d: dict[str, Any]) -> list[str]:
    """Router CPU per request against vllm-router and the floor (bench/python_floor.py), and the router CPU
    targets judged on the run (bench/router_overhead.router_targets), when the run measured both."""
    t = _judged(d)
    if "cpu_vs_vllm_router" not in t or "cpu_over_floor_ms_per_req" not in t:
        return []
    room = "cpu_2x_room_ms" in t
    lines = ["Router CPU per request, ms (non-streamed / streamed): polyspec, vllm-router, their ratio, the Python "
             "floor (its server and upstream client with nothing on top) and polyspec's own work (polyspec − floor)"
             + (", and what 2x vllm-router's CPU leaves above the floor (2 × vllm_router − floor)" if room else "")
             + ":", "", "| conc | polyspec | vllm_router | polyspec / vllm_router | floor | polyspec − floor |"
             + (" 2x room above floor |" if room else ""), "|---:|---:|---:|---:|---:|---:|" + ("---:|" if room else "")]
    for conc, by in d["concurrency"].items():
        cells = [f"{by[n]['cpu_ms_per_req']:.2f} / {by[n]['stream']['cpu_ms_per_req']:.2f}" for n in ("polyspec", "vllm_router")]
        cells.append(" / ".join(f"{x:.2f}x" for x in t["cpu_vs_vllm_router"][conc]))
        cells.append(" / ".join(f"{x:.2f}" for x in t["cpu_floor_ms_per_req"][conc]))
        cells.append(" / ".join(f"{x:.2f}" for x in t["cpu_over_floor_ms_per_req"][conc]))
        if room:
            cells.append(" / ".join(f"{x:.2f}" for x in t["cpu_2x_room_ms"][conc]))
        lines.append(f"| {conc} | " + " | ".join(cells) + " |")
    return [*lines, "", *_target_md(d), ""]


def _judged(d: dict[str, Any]) -> dict[str, Any]:
    """router_targets on the run's cells, with the lower bound of polyspec's own work the run measured."""
    own = d.get("own_work_in_loop") or {}
    return router_targets(d["concurrency"], own.get("own_work_ms"))


def _target_md(d: dict[str, Any]) -> list[str]:
    """The router CPU targets on the run, one line each: met or missed, and by what."""
    t = _judged(d)

    def verdict(key: str) -> str:
        return "**met**" if t[key] else "**missed**"

    ratio_cell = max(((conc, streamed) for conc in t["cpu_vs_vllm_router"] for streamed in (0, 1)),
                     key=lambda cell: t["cpu_vs_vllm_router"][cell[0]][cell[1]])  # the first of equal cells
    own_conc = max(t["cpu_over_floor_ms_per_req"], key=lambda conc: t["cpu_over_floor_ms_per_req"][conc][0])
    lines = ["Router CPU targets in this run (`router_targets`, language ID and the speed policy on):", "",
             f"- polyspec's CPU per request at most {CPU_RATIO_TARGET:g}x vllm-router's in every cell: "
             f"{verdict('cpu_within_2x_vllm_router')}; the highest ratio {t['cpu_vs_vllm_router_max']:.2f}x "
             f"(c={ratio_cell[0]}{', streamed' if ratio_cell[1] else ''}).",
             f"- polyspec's own work above the Python floor at most {FLOOR_EXCESS_TARGET_MS:g} ms per request, not streamed: "
             f"{verdict('cpu_over_floor_within_0_2ms')}; the most {t['cpu_over_floor_max_ms']:.3f} ms (c={own_conc})."]
    if "c256_p50_added_ms" in t:
        added = t["c256_p50_added_ms"]
        lines.append(f"- added p50 at c=256 (non-streamed, over direct) no worse than vllm-router's: "
                     f"{verdict('c256_p50_no_worse_than_vllm_router')}; polyspec {added['polyspec']:+.1f} ms, "
                     f"vllm-router {added['vllm_router']:+.1f} ms.")
    if "cpu_2x_reachable" in t:
        out = [f"c={conc}{', streamed' if streamed else ''} ({t['cpu_2x_room_ms'][conc][streamed]:.3f} ms)"
               for conc, pair in t["cpu_2x_reachable"].items() for streamed, ok in enumerate(pair) if not ok]
        kept = [ratio for conc, pair in t["cpu_vs_vllm_router"].items() for ratio, ok
                in zip(pair, t["cpu_2x_reachable"][conc]) if ok]
        lines += [f"- polyspec's own work costs at least {t['own_work_lower_bound_ms']:.3f} ms per request (its stages "
                  "in a tight loop on the router's core, in this run: `own_work_in_loop`). Where 2x vllm-router's CPU "
                  "leaves less than that above the floor, no polyspec on this server and client can be within 2x: "
                  + (", ".join(out) if out else "no cell") + ". "
                  f"Within {CPU_RATIO_TARGET:g}x in the other cells: {verdict('cpu_within_2x_where_reachable')}"
                  + (f"; the highest ratio there {max(kept):.2f}x." if kept else ".")]
        if "router_cpu_intent_met" in t:
            lines.append(f"- the floor target, the ratio where it is reachable and the latency target together: "
                         f"{verdict('router_cpu_intent_met')}.")
    return lines


def load_md(d: dict[str, Any]) -> str:
    c, r = d["client"], d["reconciliation"]
    rows = [("concurrency", d["concurrency"]), ("requests sent (client)", c["requests"]), ("answered ok", c["ok"]),
            ("errors (client, by kind)", f"{c['errors']} {c['error_kinds'] or ''}"),
            ("router `polyspec_requests_total` delta", f"{r['router_total']:.0f} {r['router_by_status']}"),
            ("reconciled (client = router)", r["reconciled"]), ("req/s", c["rps"]),
            ("latency p50 / p99 ms", f"{c['latency_ms']['p50']:.0f} / {c['latency_ms']['p99']:.0f}"),
            ("TTFB p50 / p99 ms", f"{c['ttfb_ms']['p50']:.0f} / {c['ttfb_ms']['p99']:.0f}"),
            ("router RSS first / last sample MiB", f"{d['rss_mb'][0][1]:.1f} / {d['rss_mb'][-1][1]:.1f}"),
            ("RSS slope MiB/min (after first 20%)", f"{d['rss_slope_mb_per_min']:+.2f}"),
            ("by language (router)", ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["router_by_language"].items())))]
    return "\n".join(["| measure | value |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in rows])


def e2e_md(d: dict[str, Any]) -> str:
    labels = {"fr_draft": "French draft", "en_draft": "English draft", "no_spec": "no speculation"}
    be = d["headline"]["break_even"]
    lines = ["| traffic | system (router) | tokens/s | per pass | vs no-spec | pos 1 | pos 2 | pos 3 | MAL | ms/step "
             "| break-even MAL |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lang in ("fr", "en"):
        base = d["results"]["no_spec"][lang]["tokens_per_s"]
        for system, label in labels.items():
            r = d["results"][system][lang]
            acc = r["acceptance_per_position"] or ["–"] * 3
            router = next(x["router"] for x in d["requests"] if x["system"] == system and x["language"] == lang)
            lines.append(f"| {lang} | {label} (`{router}`) | {r['tokens_per_s']:.2f} | "
                         f"{' / '.join(f'{x:.2f}' for x in r.get('tokens_per_s_per_pass', []))} | "
                         f"{r['tokens_per_s'] / base:.3f} | {' | '.join(str(a) for a in acc)} | "
                         f"{r['mean_acceptance_length'] or '–'} | {r['ms_per_engine_step']} | "
                         f"{be.get(f'{system}_{lang}', {}).get('break_even_mal', '–')} |")
    lines += ["", "| tokens/s ratio | value | 95% interval (prompts) | per pass | per-prompt median |",
              "|---|---:|---:|---:|---:|"]
    for name, r in d["headline"].items():
        if name != "break_even" and r.get("ratio") is not None:
            lines.append(f"| {name} | {r['ratio']:.3f} | {interval_text(r.get('ci95'), r['prompts'])} | "
                         f"{' / '.join(str(x) for x in r.get('per_pass', [])) or '–'} | {r['per_prompt_median']:.3f} |")
    return "\n".join(lines)


def hostile_md(d: dict[str, Any]) -> str:
    lines = ["| shape | size | median ms | max ms | ms per MB |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['shape']} | {r['size']} | {r['median_ms']:.2f} | {r['max_ms']:.2f} | {r['ms_per_mb']:.2f} |"
              for r in d["prerouting"]]
    h = d["health"]
    lines += ["", f"/health latency, {h['rounds']} alternating rounds of {h['seconds_per_phase']:g} s:", "",
              "| phase | p50 ms | p95 ms | p99 ms | max ms | samples |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {st['p50']:.2f} | {st['p95']:.2f} | {st['p99']:.2f} | {st['max']:.2f} | {st['samples']} |"
              for name, st in h["ms"].items()]
    r = h["attack_over_idle_p99"]
    kind = "Student-t" if r.get("interval") == "student-t" else "bootstrap"
    lines += ["", f"p99 under attack / idle: {r['mean']:.2f} (95% {kind} interval over rounds "
              f"{r['ci95'][0]:.2f}–{r['ci95'][1]:.2f}; {'above' if r['ci95'][0] > 1 else 'crosses'} 1.0)."]
    return "\n".join(lines)


def speed_policy_md(d: dict[str, Any]) -> str:
    """docs/speed.md's table and the run's summary under it: every figure comes from the JSON."""
    lines = ["| language | no speculation tok/s | MAL policy tok/s | speed policy tok/s (95% CI) | speed / better other "
             "(95% CI) | speed / no speculation (95% CI) | speed policy engine(s) | MAL policy engine(s) | "
             "predicted tok/s | n |",
             "|---|---:|---:|---:|---:|---:|---|---|---:|---:|"]

    def engines(counts: dict[str, int]) -> str:
        return ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))

    def ratio(vs: dict[str, Any]) -> str:
        if vs.get("ratio") is None:
            return "-"
        if not vs.get("ci95"):
            return f"{vs['ratio']:.3f} (no interval: {vs.get('prompts', 0)} prompts)"
        crossed = " (crosses 1.0)" if vs["ci95"][0] <= 1.0 <= vs["ci95"][1] else ""
        return f"{vs['ratio']:.3f} [{vs['ci95'][0]:.3f}, {vs['ci95'][1]:.3f}]{crossed}"

    for lang, r in d["languages"].items():
        ci = f"[{r['ci95'][0]}, {r['ci95'][1]}]" if r["ci95"] else "(no interval)"
        predicted = r["speed_policy_predicted_tps_mean"]
        lines.append(
            f"| {lang} | {r['no_spec_tps']:.2f} | {r['mal_policy_tps']:.2f} | {r['speed_policy_tps']:.2f} "
            f"{ci} | {ratio(r['speed_over_best_other'])} vs {r['best_other']} | "
            f"{ratio(r.get('speed_over_no_spec') or {})} | {engines(r['engines']['speed_policy'])} | "
            f"{engines(r['engines']['mal_policy'])} | {'-' if predicted is None else f'{predicted:.2f}'} | {r['n']} |")
    settings, seconds = d.get("settings") or {}, d.get("seconds") or {}
    if settings and seconds:
        lines += ["", f"The run: {settings['turns']} MT-Bench first turns per language, {settings['max_tokens']} tokens "
                  f"each, greedy, one request at a time, policies in "
                  f"{'balanced orders' if d.get('carryover') else 'rotating order'}; {len(d.get('calibration', []))} "
                  f"engines (started in {seconds['engines_start'] / 60:.0f} of the run's {seconds['total'] / 60:.0f} "
                  f"minutes), k = {settings['k']}."]
        for lang in settings.get("no_draft", []):
            r = d["languages"][lang]
            lines.append(f"Language without a deployed draft ({lang}): the MAL policy used "
                         f"{engines(r['engines']['mal_policy'])}, the speed policy {engines(r['engines']['speed_policy'])}; "
                         f"speed / MAL policy {ratio(r['speed_over_mal'])}, speed / no speculation "
                         f"{ratio(r['speed_over_no_spec'])}.")
    carry = d.get("carryover")
    if carry:  # runs in rotating order have no carry-over
        said = {"speed_after_mal": "the speed policy's request straight after the MAL policy's",
                "mal_after_speed": "the MAL policy's straight after the speed policy's",
                "apart": "the no-spec request between them"}
        parts = [f"{said[name]}: {ratio(c) if c.get('ci95') else c.get('ratio', '-')} ({c['prompts']} prompts)"
                 for name, c in carry.items()]
        lines.append("Carry-over, speed / MAL policy tok/s where both used one engine, by order: " + "; ".join(parts) + ".")
    lines += _speed_policy_bar(d)
    steps = d.get("engine_steps")
    if steps:  # older runs' JSON has no engine step times
        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1000:.1f}"

        shaped = any("shared_step_s" in e for e in steps.values())  # older runs' JSON has no engine shapes
        lines += ["", "| engine | calibrated ms/step, batch 1 |" + (" its shape's, batch 1 (engines) |" if shaped else "")
                  + " live ms/step, median of the run's requests | requests |",
                  "|---|---:|" + ("---:|" if shaped else "") + "---:|---:|"]
        for name, e in steps.items():
            shape = f" {ms(e['shared_step_s'])} ({e['shape_engines']}) |" if shaped else ""
            lines.append(f"| {name} | {ms(e['calibrated_step_s'])} |{shape} {ms(e['live_step_s_median'])} | "
                         f"{e['live_requests']} |")
    return "\n".join(lines)


def _speed_policy_bar(d: dict[str, Any]) -> list[str]:
    """The speed policy's bar, judged on the point estimates: speed >= 0.95 x the better other policy on every
    language, and speed > MAL on each language without a draft. An A/A run (`--aa`) has no bar: both routers
    run the speed policy, and what their ratio shows is the bench's own lean."""
    if (d.get("settings") or {}).get("aa"):
        return ["A/A run: the router in the 'MAL policy' column ran the speed policy too, so speed / MAL and the "
                "carry-over measure the bench itself (1.0 expected); there is no bar to judge."]
    missed = [f"{lang} ({r['speed_policy_tps'] / max(r['no_spec_tps'], r['mal_policy_tps']):.3f})"
              for lang, r in d["languages"].items()
              if r["speed_policy_tps"] < 0.95 * max(r["no_spec_tps"], r["mal_policy_tps"])]
    behind = [lang for lang in (d.get("settings") or {}).get("no_draft", [])
              if d["languages"][lang]["speed_policy_tps"] <= d["languages"][lang]["mal_policy_tps"]]
    line = ("Bar (speed policy at least 0.95 x the better other policy, point estimates): "
            + (f"missed on {', '.join(missed)}" if missed else "met on every language"))
    if (d.get("settings") or {}).get("no_draft"):
        line += ("; speed above MAL on the language(s) without a draft: "
                 + (f"no, on {', '.join(behind)}" if behind else "yes"))
    return [line + "."]


def langid_md(d: dict[str, Any]) -> str:
    cuts = list(d["cuts"])
    systems = d["systems"]
    lines = ["Accuracy, mean over the " + str(len(d["languages"])) + " languages (pooled over texts in brackets), "
             "and texts/s (one text per call, one thread):", "",
             "| system | labels | " + " | ".join(cuts) + " | texts/s mixed | " + " | ".join(f"texts/s {c}" for c in cuts)
             + " |", "|---|---|" + "---:|" * (2 * len(cuts) + 1)]
    for system, label in systems.items():
        for mode in ("unrestricted", "restricted"):
            acc = [d["accuracy"][c][system][mode] for c in cuts]
            speed = d["texts_per_s"][system][mode]
            labels = "all" if mode == "unrestricted" else f"{len(d['restricted_to'])} languages"
            lines.append(f"| {label} | {labels} | "
                         + " | ".join(f"{a['mean']:.3f} ({a['all']:.3f})" for a in acc)
                         + f" | {speed['mixed']:,} | " + " | ".join(f"{speed[c]:,}" for c in cuts) + " |")
    lines += ["", "Per language, no restriction (all labels):", "",
              "| lang | n 2w | " + " | ".join(f"{c} {s}" for c in ("sentences", "2w", "1w") for s in ("before", "now"))
              + " |", "|---|---:|" + "---:|" * 6]
    for lang in [*d["languages"], "mean"]:
        cells = [f"{d['accuracy'][c][s]['unrestricted'].get(lang, float('nan')):.3f}" for c in ("sentences", "2w", "1w")
                 for s in systems]
        lines.append(f"| {lang} | {d['counts']['2w'].get(lang, '')} | " + " | ".join(cells) + " |")
    before, now = (d["texts_per_s"][s] for s in systems)
    lines += ["", "| measure | target | unrestricted | restricted |", "|---|---:|---:|---:|",
              f"| 2 words, now | {d['targets']['2w_unrestricted']} | "
              f"{d['accuracy']['2w']['fasttext+lingua']['unrestricted']['mean']:.3f} | "
              f"{d['accuracy']['2w']['fasttext+lingua']['restricted']['mean']:.3f} |",
              f"| sentences, now | {d['targets']['sentences_unrestricted']} | "
              f"{d['accuracy']['sentences']['fasttext+lingua']['unrestricted']['mean']:.3f} | "
              f"{d['accuracy']['sentences']['fasttext+lingua']['restricted']['mean']:.3f} |",
              f"| texts/s mixed, now | {d['targets']['mixed_texts_per_s']:,} | {now['unrestricted']['mixed']:,} | "
              f"{now['restricted']['mixed']:,} |",
              f"| texts/s mixed, now / before | {d['targets']['mixed_texts_per_s_vs_before']} | "
              + " | ".join(f"{now[m]['mixed'] / before[m]['mixed']:.2f}" for m in ("unrestricted", "restricted")) + " |"]
    release = d["texts_per_s"].get("release")
    if release is not None:  # JSON from before the release path was timed has no such row
        lines.append(f"| texts/s mixed, now / release (f8ae327: {release['unrestricted']['mixed']:,} and "
                     f"{release['restricted']['mixed']:,}) | {d['targets']['mixed_texts_per_s_vs_release']} | "
                     + " | ".join(f"{now[m]['mixed'] / release[m]['mixed']:.2f}" for m in ("unrestricted", "restricted"))
                     + " |")
    procs = d.get("texts_per_s_processes")
    if procs is not None:  # JSON from before `polyspec langid --workers` was timed has no such rows
        for workers in sorted(procs["unrestricted"], key=int):
            lines.append(f"| texts/s mixed, `polyspec langid --workers {workers}` (cleaning included) | "
                         f"{d['targets']['mixed_texts_per_s']:,} | {procs['unrestricted'][workers]:,} | "
                         f"{procs['restricted'][workers]:,} |")
    lines += ["", "| threshold | fallback (short) | routed accuracy (short) | misrouted (short) | cross-script misrouted "
              "| utility c=1 | c=2 | c=4 |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d["short_sweep"]:
        mark = "**" if r["threshold"] == d["chosen_threshold"] else ""
        lines.append(f"| {mark}{r['threshold']:.2f}{mark} | {r['fallback_rate']:.3f} | {r['routed_accuracy']:.3f} | "
                     f"{r['misrouted_rate']:.3f} | {r['cross_script_misrouted_rate']:.3f} | "
                     + " | ".join(f"{r[f'utility_cost{c}']:.3f}" for c in (1, 2, 4)) + " |")
    lines += ["", f"Best threshold by misroute cost: {d['best_threshold_by_cost']} (chosen at c = {d['misroute_cost']:g}: "
              f"**{d['chosen_threshold']}**)."]
    return "\n".join(lines)


def adaptation_md(d: dict[str, Any]) -> str:
    """docs/results/adaptation.json (bench/adapt.py): one row per closed-loop run."""
    def f(v: Any, digits: int = 2) -> str:
        return "–" if v is None else f"{v:.{digits}f}"

    lines = ["| language | trained on | prompts (train / held out) | live MAL before → after | "
             "live tok/s before → after | requests during swap | failed | minutes to serving |",
             "|---|---|---|---|---|---|---|---|"]
    for r in d["runs"]:
        lines.append(f"| {r['language']} | {r['trained_on']} | {r.get('train_prompts', '–')} / "
                     f"{r.get('heldout_prompts', '–')} | {f(r['live_mal_before'])} → {f(r['live_mal_after'])} | "
                     f"{f(r['live_tps_before'], 1)} → {f(r['live_tps_after'], 1)} | {r['requests_during_swap']} | "
                     f"{r['failed_requests_during_swap']} | {f(r['minutes_detection_to_serving'], 1)} |")
    return "\n".join(lines)


def router_budget_md(d: dict[str, Any]) -> str:
    """bench/router_budget.py: polyspec's own work per non-streamed request, the apps in-process, the budget."""
    c, apps = d["conclusion"], d["apps"]
    lines = ["| stage (tight loop over the bodies, one thread) | median us | min-max us |", "|---|---:|---:|"]
    for name, s in d["stages"].items():
        lines.append(f"| {d['labels'][name].strip()} | {s['median_us']:.1f} | {s['min_us']:.1f}-{s['max_us']:.1f} |")
    lines += ["", f"Stages of polyspec's own work ({', '.join(d['own_work'])}), summed: "
              f"**{1000 * c['stages_sum_ms']:.0f} us** ({d['bodies']} bodies, {d['repeats']} passes each).", "",
              f"| app in-process, one request at a time ({apps['rounds']} alternating rounds of "
              f"{apps['requests_per_round']}) | CPU ms per request, median | min-max |", "|---|---:|---:|"]
    for name in ("polyspec", "floor"):
        vals = apps["cpu_ms"][name]
        lines.append(f"| {name} | {apps['median_ms'][name]:.3f} | {min(vals):.3f}-{max(vals):.3f} |")
    low, high = apps["own_work_range_ms"]
    lines.append(f"| polyspec - floor (per round) | {apps['own_work_ms']:.3f} | {low:.3f}-{high:.3f} |")
    tight = {"fasttext_read": "fasttext_read", "route": "route", "response_record": "response_telemetry"}
    lines += ["", "| timed inside polyspec's app (one pass) against the same code in a tight loop | inside, us per call | "
              "tight loop, us per call | calls per request |", "|---|---:|---:|---:|"]
    for label, t in apps["inside_app_us"].items():
        loop = d["stages"][tight[label]]["median_us"]
        name = (d["labels"][tight[label]].strip().removeprefix("of which: ") if label != "response_record"
                else "record: telemetry, live steps, speed (the tight loop includes the response decode)")
        lines.append(f"| {name} | {t['per_call_us']:.1f} | {loop:.1f} | {t['calls_per_request']:.2f} |")
    g = apps["gc"]
    lines += ["", f"Garbage collection of the loaded router: a full collection takes {g['full_collection_ms']:.1f} ms "
              f"over the objects it holds, {g['full_collection_frozen_ms']:.3f} ms once they are frozen "
              f"({g['frozen_objects']:,} objects); during the app rounds, collections per 1,000 requests by "
              f"generation: {', '.join(f'{n:g}' for n in g['collections_per_1000_requests'])}."]
    if "floor_non_stream_ms" in c:
        def span(key: str) -> str:
            return f"{c[key][0]:.3f}-{c[key][1]:.3f}"
        lines += ["", "| the router CPU targets, non-streamed (measured under load: router_overhead.json, c = 1 to 256) "
                  "| ms |", "|---|---:|",
                  f"| polyspec's own work allowed above the floor (target) | {c['own_work_target_ms']:.3f} |",
                  f"| language ID (tight-loop time) | {c['langid_ms']:.3f} |",
                  f"| left of the target for everything but language ID | {c['left_for_the_rest_ms']:.3f} |",
                  f"| the stages' sum (tight loop) | {c['stages_sum_ms']:.3f} |",
                  f"| polyspec's app minus the floor's app (in-process) | {c['app_own_work_ms']:.3f} |",
                  f"| polyspec's own work measured under load (polyspec − floor) | {span('measured_own_work_ms')} |",
                  f"| the floor: server and upstream client, nothing on top | {span('floor_non_stream_ms')} |",
                  f"| of which the HTTP server (floor minus the floor's app in-process) | {span('server_share_ms')} |"]
        if "vllm_router_ratio_ms" in c:
            lines.append(f"| {c['cpu_ratio_target']:g}x vllm-router's CPU per request (the other target) | "
                         f"{span('vllm_router_ratio_ms')} |")
        lines.append(f"| polyspec measured | {span('measured_polyspec_ms')} |")
    return "\n".join(lines)


_SERVER_VERDICT = {"no difference": "no measured difference", "candidate cheaper": "cheaper", "candidate dearer": "dearer"}


def server_floor_md(d: dict[str, Any]) -> str:
    """bench/server_floor.py: the floor's CPU per request under each HTTP server, and each against uvicorn."""
    base, others = d["base"], [s for s in d["servers"] if s != d["base"]]
    lines = ["| conc | stream | " + " | ".join(f"{s} ms/req" for s in d["servers"]) + " | "
             + " | ".join(f"{s} / {base} (95 % interval)" for s in others) + " |",
             "|---:|---|" + "---:|" * len(d["servers"]) + "---|" * len(others)]
    for c in d["cells"]:
        cpu = " | ".join(f"{statistics.median(c['cpu_ms'][s]):.3f}" for s in d["servers"])
        vs = " | ".join(f"{v['ratio_mean']:.3f} ({v['ratio_ci95'][0]:.3f}-{v['ratio_ci95'][1]:.3f}): "
                        f"{_SERVER_VERDICT[v['verdict']]}" for v in (c["vs_uvicorn"][s] for s in others))
        lines.append(f"| {c['concurrency']} | {'yes' if c['stream'] else 'no'} | {cpu} | {vs} |")
    lines += ["", f"{d['rounds']} rounds, each measuring every server at every cell ({d['requests']} requests or "
              f"{d['max_seconds']:g} s), in an order that rotates per round; CPU ms per request are medians over rounds; "
              "an interval that crosses 1.0 is no measured difference."]
    return "\n".join(lines)


def router_ab_md(folder: Path) -> str:
    """Every recorded bench/router_ab.py run: per cell, the candidate's CPU per request over the baseline's."""
    lines = ["| run | conc | stream | base ms/req | candidate ms/req | ratio | 95 % interval (Student t) | verdict "
             "| as first reported (bootstrap) |", "|---|---:|---|---:|---:|---:|---:|---|---|"]
    notes = []
    for path in sorted(folder.glob("*.json")):
        d = json.loads(path.read_text())
        notes.append(f"- **{d['label']}**: base {d['base']}, candidate {d['candidate']} ({d['rounds']} rounds, "
                     f"folders {', '.join(d['folders'])} from the refs). {d['description']}.")
        for c in d["cells"]:
            med = [statistics.median(c[k]) for k in ("base_cpu_ms", "candidate_cpu_ms")]
            lines.append(f"| {d['label']} | {c['concurrency']} | "
                         f"{'yes' if c['stream'] else 'no'} | {med[0]:.3f} | {med[1]:.3f} | {c['ratio_mean']:.3f} | "
                         f"{c['ratio_ci95'][0]:.3f}-{c['ratio_ci95'][1]:.3f} | {c['verdict']} | "
                         f"{c.get('verdict_bootstrap', '–')} |")
    return "\n".join([*notes, "", *lines])


def main() -> None:
    name = sys.argv[1]
    if (OUT / name).is_dir():
        print(router_ab_md(OUT / name))
        return
    path = Path(name) if Path(name).is_file() else OUT / name
    d = json.loads(path.read_text())
    if "runs" in d:
        print(adaptation_md(d))
        return
    print({"router_overhead": overhead_md, "load": load_md, "e2e_speedup": e2e_md, "hostile": hostile_md,
           "speed_policy": speed_policy_md, "langid": langid_md,
           "router_budget": router_budget_md, "server_floor": server_floor_md,
           "fleet_plan": fleet_plan_md}[d["benchmark"]](d))


if __name__ == "__main__":
    main()
