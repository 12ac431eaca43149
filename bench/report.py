"""Markdown tables for docs/benchmarks.md from the JSON results (so the doc quotes measured numbers).

    .venv/bin/python bench/report.py router_overhead.json
    .venv/bin/python bench/report.py load.json
    .venv/bin/python bench/report.py e2e_speedup.json
    .venv/bin/python bench/report.py hostile.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
SYSTEMS = ["direct", "polyspec", "litellm", "vllm_router"]


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
    lines += ["Targets (reported, not asserted): `" + json.dumps(d["targets"]) + "`", ""]
    prof = d.get("profile")
    if prof:
        lines += [f"Profile of polyspec at concurrency {prof['concurrency']} (half streamed), {prof['samples']} samples, "
                  f"{prof['tool']}:", "", "| component (inclusive) | share |", "|---|---:|"]
        lines += [f"| {r['function']} | {100 * r['share']:.1f}% |" for r in prof.get("components", [])]
        lines += ["", "| top self time | share |", "|---|---:|"]
        lines += [f"| `{r['function']}` | {100 * r['share']:.1f}% |" for r in prof["self"][:12]]
    return "\n".join(lines)


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
            lines.append(f"| {name} | {r['ratio']:.3f} | {r['ci95'][0]:.3f}–{r['ci95'][1]:.3f} | "
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
    lines += ["", f"p99 under attack / idle: {r['mean']:.2f} (95% bootstrap interval over rounds "
              f"{r['ci95'][0]:.2f}–{r['ci95'][1]:.2f}; {'above' if r['ci95'][0] > 1 else 'crosses'} 1.0)."]
    return "\n".join(lines)


def main() -> None:
    name = sys.argv[1]
    d = json.loads((OUT / name).read_text())
    print({"router_overhead": overhead_md, "load": load_md, "e2e_speedup": e2e_md, "hostile": hostile_md}[d["benchmark"]](d))


if __name__ == "__main__":
    main()
