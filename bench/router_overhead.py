"""Router overhead: polyspec vs a direct call, the LiteLLM proxy and vllm-router, side by side in one run.

One fake OpenAI backend (bench/fake_openai.py: fixed 16-token answers, no delay) is shared by all
systems, so what differs is the routers' own cost. polyspec runs `polyspec serve` with language
identification on (a registry with one default deployment at the backend, serving 9 languages; the
prompts are MT-Bench turns of those languages) and the speed policy (``--policy``; the router CPU targets,
``router_targets``, are judged with it). With ``--baseline REF``, a second polyspec (``polyspec_base``) runs the code of git commit REF
(from `git archive`, on PYTHONPATH; the working tree is not touched), only for ``--baseline-folders`` if
given (e.g. ``router``: the rest as in the working tree), so a change is compared before/after within one
run. Clients: bench/loadgen.py (httpx, uvloop) in its own process. On this 2-core machine the router under test is pinned to core 0 and the backend and the load
generator to core 1 (taskset), so every router gets the same single core and the client never steals it.

Per system and concurrency (1, 16, 64, 256), non-streamed and streamed: p50/p99 latency, time to first
byte (streams), requests/s, router CPU per request (psutil cpu_times delta / requests) and RSS.
Each load run is bounded by a request count and a deadline. Then polyspec is profiled under load with
py-spy (from .venv-bench) and the hottest functions are listed. Before the load runs, polyspec's own work is
timed in a tight loop on the router's core (``own_work_in_loop``: the least it costs per request), so that the
run itself says in which cells 2x vllm-router's CPU leaves room for it above the floor (``router_targets``).

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/router_overhead.py [--baseline HEAD [--baseline-folders router]]
    .venv/bin/python bench/router_overhead.py --quick
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import profiling  # noqa: E402
from bench.common import BenchError, machine_info, mtbench_turns, write_json  # noqa: E402
from bench.servers import (  # noqa: E402
    SERVED_LANGUAGES, Server, make_registry, start_backend, start_litellm, start_polyspec, start_python_floor,
    start_vllm_router,
)

ROUTER_CPU, CLIENT_CPU = "0", "1"
SYSTEMS = ["direct", "polyspec", "polyspec_base", "python_floor", "litellm", "vllm_router"]
PACKAGES = {"polyspec": "polyspec", "core": "core", "models": "models", "registry": "registry", "router": "router",
            "training": "training"}  # installed name under polyspec/ -> folder of the tree (pyproject's package-dir)
console = Console(width=150)


def request_bodies(per_lang: int) -> list[dict[str, Any]]:
    """Chat requests on MT-Bench first turns, languages interleaved (fr, de, ..., en, fr, ...)."""
    per = {lang: mtbench_turns(lang, per_lang, turn=0) for lang in SERVED_LANGUAGES}
    bodies = []
    for i in range(per_lang):
        for lang in SERVED_LANGUAGES:
            if i < len(per[lang]):
                bodies.append({"model": "polyspec", "messages": [{"role": "user", "content": per[lang][i]}],
                               "max_tokens": 16, "temperature": 0})
    return bodies


def cpu_seconds(pid: int) -> float:
    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)]
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def rss_mb(pid: int) -> float:
    proc = psutil.Process(pid)
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return round(total / 2**20, 1)


def run_loadgen(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)
        path = f.name
    try:
        cmd = ["taskset", "-c", CLIENT_CPU, sys.executable, str(Path(__file__).parent / "loadgen.py"), path]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        Path(path).unlink(missing_ok=True)
    if proc.returncode != 0:
        raise BenchError(f"loadgen failed: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout)


def measure(server: Server | None, url: str, headers: dict[str, str], bodies: list[dict], conc: int, stream: bool,
            requests: int, max_seconds: float) -> dict[str, Any]:
    spec = {"url": f"{url}/v1/chat/completions", "bodies": [{**b, "stream": stream} for b in bodies],
            "concurrency": conc, "requests": requests, "max_seconds": max_seconds, "stream": stream,
            "warmup": min(2 * conc, 128), "headers": headers, "timeout_s": 60}
    cpu0 = cpu_seconds(server.pid) if server else 0.0
    res = run_loadgen(spec, timeout=max_seconds + 240)
    cpu1 = cpu_seconds(server.pid) if server else 0.0
    warm_and_measured = res["requests"] + spec["warmup"]
    out = {"p50_ms": res["latency_ms"]["p50"], "p99_ms": res["latency_ms"]["p99"], "rps": res["rps"],
           "ttfb_p50_ms": res["ttfb_ms"]["p50"], "ttfb_p99_ms": res["ttfb_ms"]["p99"],
           "requests": res["requests"], "errors": res["errors"], "error_kinds": res["error_kinds"]}
    if server is not None:
        out["cpu_ms_per_req"] = round(1000 * (cpu1 - cpu0) / max(1, warm_and_measured), 3)
        out["rss_mb"] = rss_mb(server.pid)
    return out


def overhead_rows(conc_result: dict[str, Any]) -> dict[str, Any]:
    direct = conc_result["direct"]
    rows = {}
    for name in SYSTEMS[1:]:
        s = conc_result.get(name)
        if s:
            rows[name] = {"p50_overhead_ms": round(s["p50_ms"] - direct["p50_ms"], 3),
                          "p99_overhead_ms": round(s["p99_ms"] - direct["p99_ms"], 3)}
    return rows


def print_table(results: dict[str, Any], mode: str) -> None:
    table = Table(title=f"Router overhead ({mode}); fake backend; ratios within this run matter, not absolutes")
    for col in ("conc", "system", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", "ttfb p50", "req/s", "CPU ms/req",
                "RSS MB", "errors"):
        table.add_column(col, justify="right" if col not in ("system",) else "left", no_wrap=True)
    for conc, by_sys in results.items():
        direct = by_sys["direct"] if mode == "non-stream" else by_sys["direct"]["stream"]
        for name in SYSTEMS:
            if name not in by_sys:
                continue
            s = by_sys[name] if mode == "non-stream" else by_sys[name]["stream"]
            table.add_row(conc, name, f"{s['p50_ms']:.2f}", f"{s['p99_ms']:.2f}",
                          f"{s['p50_ms'] - direct['p50_ms']:+.2f}", f"{s['p99_ms'] - direct['p99_ms']:+.2f}",
                          f"{s['ttfb_p50_ms']:.2f}", f"{s['rps']:.0f}", str(s.get("cpu_ms_per_req", "-")),
                          str(s.get("rss_mb", "-")), str(s["errors"]))
        table.add_section()
    console.print(table)


def targets(results: dict[str, Any], own_work_ms: float | None = None) -> dict[str, Any]:
    c = results.get("64") or results[max(results, key=int)]
    out: dict[str, Any] = {"at_concurrency": 64 if "64" in results else int(max(results, key=int))}
    if "polyspec" in c:
        over = overhead_rows(c)["polyspec"]
        out["polyspec_p50_overhead_ms"] = over["p50_overhead_ms"]
        out["polyspec_p99_overhead_ms"] = over["p99_overhead_ms"]
        out["p50_within_1ms"] = over["p50_overhead_ms"] <= 1.0
        out["p99_within_5ms"] = over["p99_overhead_ms"] <= 5.0
    if "polyspec" in c and "litellm" in c:
        best = {n: max(float(results[k][n]["rps"]) for k in results if n in results[k]) for n in ("polyspec", "litellm")}
        out["saturation_rps"] = best
        out["throughput_vs_litellm"] = round(best["polyspec"] / max(best["litellm"], 1e-9), 2)
        out["throughput_3x_litellm"] = out["throughput_vs_litellm"] >= 3.0
    if "polyspec" in c and "vllm_router" in c:
        rows = overhead_rows(c)
        vr = max(rows["vllm_router"]["p50_overhead_ms"], 1e-3)
        out["p50_overhead_vs_vllm_router"] = round(rows["polyspec"]["p50_overhead_ms"] / vr, 2)
        out["within_1_5x_vllm_router"] = out["p50_overhead_vs_vllm_router"] <= 1.5
    out.update(router_targets(results, own_work_ms))
    return out


def own_work_in_loop(registry: str, backend_url: str, bodies: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """The least polyspec's own work costs per request in this run: bench/router_budget.py's stages (language ID,
    ``route``, ``prepare``, the payload, the response's telemetry and headers) in a tight loop over ``bodies``,
    in this process pinned to the router's core while no load runs. A tight loop keeps the language models in
    the caches, so the sum of the stages that make up a non-streamed request's own work (``own_work_ms``) is a
    lower bound of what the same work costs inside the router under load."""
    from bench import router_budget  # it imports this module

    response = httpx.post(f"{backend_url}/v1/chat/completions", json=bodies[0], timeout=30).content
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(ROUTER_CPU)})
    try:
        samples = router_budget.measure(router_budget._runtime(registry), bodies, response, repeats)
    finally:
        os.sched_setaffinity(0, cpus)
    stages = {name: round(statistics.median(values), 2) for name, values in samples.items()}
    return {"stages_median_us": stages, "own_work_stages": list(router_budget.OWN_WORK), "repeats": repeats,
            "own_work_ms": round(sum(stages[name] for name in router_budget.OWN_WORK) / 1000, 3)}


CPU_RATIO_TARGET = 2.0  # polyspec's CPU per request over vllm-router's, at most, in every cell
FLOOR_EXCESS_TARGET_MS = 0.2  # polyspec's CPU per request above the Python floor's, at most, not streamed


def _cpu(cell: dict[str, Any]) -> list[float]:
    return [cell["cpu_ms_per_req"], cell["stream"]["cpu_ms_per_req"]]


def router_targets(results: dict[str, Any], own_work_ms: float | None = None) -> dict[str, Any]:
    """The router CPU targets, judged within one run (``results``: the JSON's ``concurrency``):

    - ``cpu_within_2x_vllm_router``: polyspec's CPU per request is at most 2x vllm-router's in every cell
      (``cpu_vs_vllm_router``: per concurrency, [non-streamed, streamed]);
    - ``cpu_over_floor_within_0_2ms``: polyspec's CPU per request above the Python floor's is at most 0.2 ms
      at every concurrency, not streamed (``cpu_over_floor_ms_per_req``: [non-streamed, streamed]);
    - ``c256_p50_no_worse_than_vllm_router``: at c=256, polyspec's p50 added over direct (non-streamed) is at
      most vllm-router's.

    ``router_cpu_targets_met`` is all three. A target whose systems the run did not measure is absent, and then
    so is ``router_cpu_targets_met``. And polyspec against polyspec_base, when the run has it.

    ``own_work_ms``: the least polyspec's own work costs per request (`own_work_in_loop`: its stages in a tight
    loop, measured in the same run on the router's core). A cell where 2x vllm-router's CPU leaves less than that
    above the floor (``cpu_2x_room_ms``: 2 x vllm-router's CPU minus the floor's) cannot meet the ratio however
    lean polyspec's work gets, short of a cheaper server and client under it: ``cpu_2x_reachable`` says which
    cells can, ``cpu_within_2x_where_reachable`` judges the ratio on those, and ``router_cpu_intent_met`` is the
    floor target, that ratio and the latency target."""
    out: dict[str, Any] = {}
    runs = results.values()
    if results and all("polyspec" in r and "vllm_router" in r for r in runs):
        ratios = {conc: [round(a / max(b, 1e-6), 2) for a, b in zip(_cpu(r["polyspec"]), _cpu(r["vllm_router"]))]
                  for conc, r in results.items()}
        out["cpu_vs_vllm_router"] = ratios  # [non-streamed, streamed]
        out["cpu_vs_vllm_router_max"] = max(x for pair in ratios.values() for x in pair)
        out["cpu_within_2x_vllm_router"] = out["cpu_vs_vllm_router_max"] <= CPU_RATIO_TARGET
    if results and all("polyspec" in r and "python_floor" in r for r in runs):
        # polyspec's own work: its CPU per request over the floor's (the same server and upstream client with
        # nothing on top); the floor alone is what no change to that work removes.
        out["cpu_floor_ms_per_req"] = {conc: _cpu(r["python_floor"]) for conc, r in results.items()}
        over = {conc: [round(a - b, 3) for a, b in zip(_cpu(r["polyspec"]), _cpu(r["python_floor"]))]
                for conc, r in results.items()}
        out["cpu_over_floor_ms_per_req"] = over  # [non-streamed, streamed]
        out["cpu_over_floor_max_ms"] = max(pair[0] for pair in over.values())  # not streamed
        out["cpu_over_floor_within_0_2ms"] = out["cpu_over_floor_max_ms"] <= FLOOR_EXCESS_TARGET_MS
    top = results.get("256")
    if top and "polyspec" in top and "vllm_router" in top:
        added = {n: round(top[n]["p50_ms"] - top["direct"]["p50_ms"], 3) for n in ("polyspec", "vllm_router")}
        out["c256_p50_added_ms"] = added
        out["c256_p50_no_worse_than_vllm_router"] = added["polyspec"] <= added["vllm_router"]
    verdicts = ("cpu_within_2x_vllm_router", "cpu_over_floor_within_0_2ms", "c256_p50_no_worse_than_vllm_router")
    if all(v in out for v in verdicts):
        out["router_cpu_targets_met"] = all(out[v] for v in verdicts)
    if own_work_ms is not None and "cpu_vs_vllm_router" in out and "cpu_floor_ms_per_req" in out:
        room = {conc: [round(CPU_RATIO_TARGET * b - f, 3) for b, f in zip(_cpu(r["vllm_router"]), _cpu(r["python_floor"]))]
                for conc, r in results.items()}
        reachable = {conc: [x >= own_work_ms for x in pair] for conc, pair in room.items()}
        out["own_work_lower_bound_ms"] = own_work_ms
        out["cpu_2x_room_ms"] = room  # [non-streamed, streamed]
        out["cpu_2x_reachable"] = reachable
        out["cpu_within_2x_where_reachable"] = all(
            ratio <= CPU_RATIO_TARGET for conc, pair in out["cpu_vs_vllm_router"].items()
            for ratio, ok in zip(pair, reachable[conc]) if ok)
        intent = ("cpu_over_floor_within_0_2ms", "cpu_within_2x_where_reachable", "c256_p50_no_worse_than_vllm_router")
        if all(v in out for v in intent):
            out["router_cpu_intent_met"] = all(out[v] for v in intent)
    if results and all("polyspec" in r and "polyspec_base" in r for r in runs):
        out["cpu_vs_baseline"] = {conc: [round(a / max(b, 1e-6), 2) for a, b in zip(_cpu(r["polyspec"]), _cpu(r["polyspec_base"]))]
                                  for conc, r in results.items()}  # [non-streamed, streamed]
    return out


def baseline_tree(workdir: Path, ref: str, folders: set[str]) -> Path:
    """The polyspec package laid out for PYTHONPATH (``<dir>/polyspec/router``, ...): ``folders`` (router,
    core, ...) as they are at commit ``ref``, from `git archive` (which reads the object store only: the
    working tree is left as it is), the others as they are in the working tree. ``folders={"router"}``
    compares router changes alone while other folders change in the working tree."""
    root = Path(__file__).resolve().parents[1]
    src, pkg = workdir / "baseline-src", workdir / "baseline-pkg"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(root), "archive", ref], capture_output=True, check=False)
    if archive.returncode != 0:
        raise BenchError(f"git archive {ref} failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    (pkg / "polyspec").mkdir(parents=True)
    for name, folder in PACKAGES.items():
        target = pkg / "polyspec" if name == "polyspec" else pkg / "polyspec" / name
        origin = src if folder in folders else root
        shutil.copytree(origin / folder, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def start_all(workdir: Path, systems: list[str], servers: dict[str, Server], policy: str = "speed",
              baseline: str | None = None, baseline_folders: set[str] | None = None) -> None:
    """Start into ``servers`` as it goes, so the caller stops what did start when a later one fails."""
    servers["backend"] = start_backend(workdir, CLIENT_CPU)
    backend = servers["backend"].url
    env = {"POLYSPEC_ROUTER_POLICY": policy}
    if "polyspec" in systems or "polyspec_base" in systems:
        reg = make_registry(workdir, [("bench", backend, SERVED_LANGUAGES, True)])
    if "polyspec" in systems:
        servers["polyspec"] = start_polyspec(workdir, reg, ROUTER_CPU, extra_env=env)
    if "polyspec_base" in systems and baseline:
        pkg = baseline_tree(workdir, baseline, baseline_folders or set(PACKAGES.values()))
        base = start_polyspec(workdir, reg, ROUTER_CPU, extra_env={**env, "PYTHONPATH": str(pkg)})
        servers["polyspec_base"] = Server("polyspec_base", base.url, base.proc, base.log, base.headers)
    if "python_floor" in systems:
        servers["python_floor"] = start_python_floor(workdir, backend, ROUTER_CPU)
    if "litellm" in systems:
        servers["litellm"] = start_litellm(workdir, backend, ROUTER_CPU)
    if "vllm_router" in systems:
        servers["vllm_router"] = start_vllm_router(workdir, backend, ROUTER_CPU)


def run_matrix(servers: dict[str, Server], systems: list[str], concs: list[int], bodies: list[dict],
               requests_per_conc: int, max_seconds: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for ci, conc in enumerate(concs):
        by_sys: dict[str, Any] = {}
        order = systems[ci % len(systems):] + systems[: ci % len(systems)]  # rotate: no system always first
        for name in order:
            server = servers.get(name) if name != "direct" else None
            url = servers["backend"].url if name == "direct" else servers[name].url
            headers = servers[name].headers if server else {}
            n = max(requests_per_conc, 8 * conc)
            console.print(f"c={conc:>3} {name:<12} non-stream / stream ...")
            by_sys[name] = measure(server, url, headers, bodies, conc, False, n, max_seconds)
            by_sys[name]["stream"] = measure(server, url, headers, bodies, conc, True, n, max_seconds)
        results[str(conc)] = {n: by_sys[n] for n in systems}
    return results


def main(
    quick: bool = typer.Option(False, "--quick", help="Smoke run: concurrency 1 and 16, few requests."),
    systems: str = typer.Option(",".join(SYSTEMS), help="Comma-separated subset of direct,polyspec,python_floor,litellm,vllm_router."),
    max_seconds: float = typer.Option(12.0, help="Time bound of each load run (seconds)."),
    requests: int = typer.Option(1500, help="Count bound of each load run (at least 8 x concurrency)."),
    profile: bool = typer.Option(True, "--profile/--no-profile", help="py-spy profile of polyspec at concurrency 64."),
    policy: str = typer.Option("speed", help="polyspec's routing policy (speed or mal)."),
    baseline: str = typer.Option("", help="Also run polyspec at this git commit (polyspec_base), e.g. HEAD."),
    baseline_folders: str = typer.Option(",".join(PACKAGES.values()),
                                         help="Folders polyspec_base takes from --baseline; the rest from the working tree."),
) -> None:
    """Measure the routers' latency, throughput, CPU and memory over one shared fake backend."""
    chosen = [s.strip() for s in systems.split(",") if s.strip() and s.strip() != "polyspec_base"]
    if baseline:
        chosen.insert(chosen.index("polyspec") + 1 if "polyspec" in chosen else len(chosen), "polyspec_base")
    if "direct" not in chosen or any(s not in SYSTEMS for s in chosen):
        console.print(f"[red]error:[/] systems must include direct and be among {SYSTEMS}")
        raise typer.Exit(2)
    concs = [1, 16] if quick else [1, 16, 64, 256]
    bodies = request_bodies(10 if quick else 40)
    if quick:
        max_seconds, requests = min(max_seconds, 4.0), min(requests, 200)
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory(prefix="polyspec-bench-") as tmp:
        try:
            folders = {f.strip() for f in baseline_folders.split(",") if f.strip()}
            start_all(Path(tmp), chosen, servers, policy, baseline or None, folders)
            own_work = None
            if "polyspec" in servers:  # before the load runs, on a registry of its own
                (Path(tmp) / "own-work").mkdir()
                backend = servers["backend"].url
                registry = make_registry(Path(tmp) / "own-work", [("bench", backend, SERVED_LANGUAGES, True)])
                own_work = own_work_in_loop(registry, backend, bodies, 3 if quick else 9)
            results = run_matrix(servers, chosen, concs, bodies, requests, max_seconds)
            prof = None
            if profile and "polyspec" in servers:
                prof = profiling.profile_under_load(servers["polyspec"], bodies, run_loadgen, CLIENT_CPU,
                                                    seconds=6 if quick else 15)
        except BenchError as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(1) from None
        finally:
            for s in servers.values():
                try:
                    s.stop()
                except subprocess.TimeoutExpired:  # a peer slow to die under load must not lose the results
                    console.print(f"[yellow]warning:[/] {s.name} (pid {s.pid}) did not stop in time")
    print_table(results, "non-stream")
    print_table({c: {n: v for n, v in r.items()} for c, r in results.items()}, "stream")
    summary = targets(results, own_work["own_work_ms"] if own_work else None)
    console.print_json(data=summary)
    if prof:
        profiling.print_hotspots(prof, console)
    payload = {"benchmark": "router_overhead", "quick": quick, "machine": machine_info(),
               "setup": {"backend": "bench/fake_openai.py, 16-token answers, no delay", "router_cpu": ROUTER_CPU,
                         "policy": policy, "baseline": baseline or None,
                         "baseline_folders": baseline_folders if baseline else None,
                         "client_and_backend_cpu": CLIENT_CPU, "client": "bench/loadgen.py (httpx + uvloop)",
                         "prompts": f"MT-Bench first turns, {len(bodies)} bodies in {len(SERVED_LANGUAGES)} languages",
                         "max_seconds_per_run": max_seconds, "requests_per_run": requests},
               "concurrency": results, "own_work_in_loop": own_work, "targets": summary, "profile": prof}
    path = write_json("router_overhead_quick.json" if quick else "router_overhead.json", payload)
    console.print(f"wrote {path}")


if __name__ == "__main__":
    typer.run(main)
