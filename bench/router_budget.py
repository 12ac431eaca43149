"""Router CPU budget: what each stage of polyspec's own work costs per request, timed in-process.

bench/router_overhead.py measures the router's CPU per request from outside, under load, and splits it
into the floor (`python_floor`: the same server and upstream client with nothing on top) and the rest.
This bench times the rest stage by stage, with the router's own functions on one thread, over the same
MT-Bench bodies and a routing table built from a real registry (one default deployment at the fake
backend serving 9 languages, the speed policy on), for non-streamed requests:

- language ID alone (``clean_for_langid`` + ``detect_cleaned``, restricted as the router asks), and within it
  the fastText read of a long prompt's head;
- ``route``: body decode, pins, classification (language ID, domain) and the speed policy's ranking;
- ``prepare``: ``route`` plus the decision's telemetry and the job;
- the engine's payload, the response's telemetry (decode + ``record``) and the response headers.

It also runs the two ASGI apps themselves in-process, one request at a time against the fake backend
(no HTTP server in front: the scope, body and send are handed over as the server would): polyspec's app
and the floor's (bench/python_floor.py), in alternating rounds, with the process's CPU time per request.
Their difference is polyspec's own work with everything around the stages (ASGI glue, the upstream
client's bookkeeping, caches shared with the language models); the floor's measured total minus its app
is the HTTP server's share. And it times a full garbage collection of the loaded router, with and without
``gc.freeze``, and counts the collections the app rounds triggered: a full collection walks the language
models' objects (tens of ms), but a steady router triggers none (they need the long-lived objects to grow by
a quarter), so freezing them was measured and dropped (docs/benchmarks.md, the gc-freeze A/B run).

The sum of the stages is what polyspec adds to the floor on a non-streamed request. Set against the router CPU
targets that bench/router_overhead.py judges (`router_targets`: polyspec's own work at most 0.2 ms above the
floor, not streamed; its CPU at most 2x vllm-router's), with the floor, polyspec and vllm-router as that
bench measured them under load, it says how far the targets are from what this design can reach.
In-process times on a quiet core are lower than the same code under load (caches, the other core's
client): read them as a lower bound on each stage.

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/router_budget.py
    .venv/bin/python bench/router_budget.py --conclude-only   # the conclusion again, on the latest router_overhead.json
    .venv/bin/python bench/report.py router_budget.json

Writes docs/benchmarks/router_budget.json.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import OUT_DIR, BenchError, machine_info, write_json  # noqa: E402
from bench.router_overhead import CPU_RATIO_TARGET, FLOOR_EXCESS_TARGET_MS, request_bodies  # noqa: E402
from bench.servers import SERVED_LANGUAGES, make_registry, start_backend  # noqa: E402

console = Console(width=150)
# The stages that make up polyspec's own work on a non-streamed request (the others are parts of these).
OWN_WORK = ("prepare", "payload", "response_telemetry", "response_headers")
LABELS = {
    "langid": "language ID (clean_for_langid + detect_cleaned, restricted)",
    "fasttext_read": "  of which: fastText's read of a long prompt's head (k=1)",
    "route": "route: decode, pins, classify (language ID, domain), speed policy",
    "prepare": "prepare: route + decision telemetry + job",
    "payload": "engine payload (body re-encoded)",
    "response_telemetry": "response: decode usage/metrics + record (telemetry, live steps, speed)",
    "response_headers": "response headers (router_headers + content type)",
}


def drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (``prepare``) without an event loop's cost per call."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise BenchError("the coroutine suspended; it cannot be timed in-process")


def time_stage(fn: Callable[[Any], Any], items: list[Any], repeats: int) -> list[float]:
    """Microseconds per item of ``fn`` over ``items``, once per repeat (one warm-up pass first)."""
    for item in items:
        fn(item)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for item in items:
            fn(item)
        out.append((time.perf_counter() - start) / len(items) * 1e6)
    return out


def summary(samples: list[float]) -> dict[str, Any]:
    return {"median_us": round(statistics.median(samples), 2), "min_us": round(min(samples), 2),
            "max_us": round(max(samples), 2), "repeats_us": [round(s, 2) for s in samples]}


def _runtime(registry: str) -> Any:
    from polyspec.router.config import RouterConfig
    from polyspec.router.runtime import RouterRuntime

    config = RouterConfig(registry_url=registry, router_id="budget", default_language="en", policy="speed",
                          refresh_interval_s=3600, flush_interval_s=3600)
    rt = RouterRuntime(config)
    result = asyncio.run(rt.refresh())
    if not result.get("ok", True) or not rt.table.pools:
        raise BenchError(f"the routing table did not load: {result}")
    return rt


def measure(rt: Any, bodies: list[dict[str, Any]], response: bytes, repeats: int) -> dict[str, list[float]]:
    from polyspec.core import langid
    from polyspec.router.edge.asgi import content_type
    from polyspec.router.engine.job import completion_telemetry, payload, record, router_headers
    from polyspec.router.engine.proxy import prepare
    from polyspec.router.decision.routing import route

    raws = [json.dumps(b).encode() for b in bodies]
    headers = {"content-type": "application/json", "content-length": "0"}
    allowed, max_chars = rt.langid_labels(rt.table), rt.config.langid_max_chars
    texts = [b["messages"][-1]["content"] for b in bodies]
    cleaned = [langid.clean_for_langid(text, max_chars) for text in texts]
    heads = [langid._head(c, langid.FASTTEXT_CHARS) for c in cleaned if len(c) >= langid.SHORT_CHARS]
    jobs = [drive(prepare(rt, raw, dict(headers), "chat", time.perf_counter())) for raw in raws]
    upstream = {"content-type": "application/json"}

    def respond(job: Any) -> None:
        job.begin_attempt(1)
        spec, tokens = completion_telemetry(response)
        record(rt, job, job.targets[0], "ok", spec, tokens)

    def answer_headers(job: Any) -> None:
        out = router_headers(job.decision, job.targets[0], upstream, job)
        out.append((b"content-type", content_type(upstream.get("content-type"), "application/json")))

    stages: dict[str, tuple[Callable[[Any], Any], list[Any]]] = {
        "langid": (lambda text: langid.detect_cleaned(langid.clean_for_langid(text, max_chars), allowed), texts),
        "fasttext_read": (lambda head: langid._fasttext(head, allowed, 1), heads),
        "route": (lambda raw: route(rt, raw, dict(headers), "chat"), raws),
        "prepare": (lambda raw: drive(prepare(rt, raw, dict(headers), "chat", 0.0)), raws),
        "payload": (lambda job: payload(rt, job, job.targets[0]), jobs),
        "response_telemetry": (respond, jobs),
        "response_headers": (answer_headers, jobs),
    }
    out: dict[str, list[float]] = {}
    with Progress(console=console) as progress:
        task = progress.add_task("stages", total=len(stages))
        for name, (fn, items) in stages.items():
            out[name] = time_stage(fn, items, repeats)
            progress.advance(task)
    return out


def _scope(raw: bytes) -> dict[str, Any]:
    """What the router's own server hands the app for a POST (router.edge.asgi.ConnectionHook included)."""
    from polyspec.router.edge.asgi import HOOK_KEY, ConnectionHook

    hook = ConnectionHook()
    hook.body_complete = True
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
            "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {},
            "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(raw)).encode())], HOOK_KEY: hook}


async def _request(app: Any, raw: bytes) -> None:
    pending = [{"type": "http.request", "body": raw, "more_body": False}]
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(_scope(raw), receive, send)
    if status != [200]:
        raise BenchError(f"the app answered {status or 'nothing'} (the fake backend must answer 200)")


class _Lifespan:
    """The app's lifespan (startup on enter, shutdown on exit), as uvicorn drives it."""

    def __init__(self, app: Any) -> None:
        self.app, self.inbox, self.outbox = app, asyncio.Queue(), asyncio.Queue()
        self.task: asyncio.Task[Any] | None = None

    async def _call(self, kind: str) -> None:
        await self.inbox.put({"type": f"lifespan.{kind}"})
        message = await self.outbox.get()
        if message["type"] != f"lifespan.{kind}.complete":
            raise BenchError(f"lifespan {kind} failed: {message}")

    async def __aenter__(self) -> Any:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self.task = asyncio.create_task(self.app(scope, self.inbox.get, self.outbox.put))
        await self._call("startup")
        return self.app

    async def __aexit__(self, *exc: Any) -> None:
        await self._call("shutdown")
        await self.task


class _GcPauses:
    """Collections per generation and their summed pause, while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.count, self.seconds, self._start = [0, 0, 0], [0.0, 0.0, 0.0], 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self._start


# Functions timed inside the app (module, attribute, label): the same code as the tight-loop stages, run
# interleaved with the event loop, the upstream client and the other stages, as under traffic.
INSIDE = (("polyspec.core.langid", "_fasttext", "fasttext_read"), ("polyspec.router.engine.proxy", "route", "route"),
          ("polyspec.router.engine.proxy", "record", "response_record"))


class _Timers:
    """Wraps INSIDE's functions with timers while installed (instrumentation of a bench, not a change)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {label: 0.0 for _, _, label in INSIDE}
        self.calls: dict[str, int] = {label: 0 for _, _, label in INSIDE}
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> _Timers:
        import importlib

        for module_name, attr, label in INSIDE:
            module = importlib.import_module(module_name)
            original = getattr(module, attr)
            self._saved.append((module, attr, original))
            setattr(module, attr, self._timed(original, label))
        return self

    def _timed(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1
        return timed

    def __exit__(self, *exc: Any) -> None:
        for module, attr, original in self._saved:
            setattr(module, attr, original)


def _full_collection_ms() -> float:
    start = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - start) * 1e3


async def measure_apps(registry: str, backend_url: str, bodies: list[dict[str, Any]], rounds: int
                       ) -> dict[str, Any]:
    """CPU ms per request of polyspec's app and the floor's, alternating ``rounds`` times; and the GC."""
    from bench.python_floor import Floor
    from polyspec.router.app import create_app
    from polyspec.router.config import RouterConfig

    raws = [json.dumps(b).encode() for b in bodies]
    config = RouterConfig(registry_url=registry, router_id="budget-app", default_language="en", policy="speed")
    apps = {"polyspec": create_app(config, mount_admin=False), "floor": Floor(backend_url)}
    cpu: dict[str, list[float]] = {name: [] for name in apps}
    pauses = _GcPauses()
    async with _Lifespan(apps["polyspec"]), _Lifespan(apps["floor"]):
        for app in apps.values():  # warm-up: connections, the routing table's caches
            for raw in raws[:50]:
                await _request(app, raw)
        gc_ms = {"full_collection_ms": round(statistics.median(_full_collection_ms() for _ in range(3)), 2)}
        gc.freeze()
        gc_ms["full_collection_frozen_ms"] = round(statistics.median(_full_collection_ms() for _ in range(3)), 3)
        gc_ms["frozen_objects"] = gc.get_freeze_count()
        gc.unfreeze()
        gc.callbacks.append(pauses)
        try:
            with Progress(console=console) as progress:
                task = progress.add_task("apps in-process (rounds x 2)", total=2 * rounds)
                for r in range(rounds):
                    for name in (("polyspec", "floor") if r % 2 == 0 else ("floor", "polyspec")):
                        start = time.process_time()
                        for raw in raws:
                            await _request(apps[name], raw)
                        cpu[name].append((time.process_time() - start) / len(raws) * 1e3)
                        progress.advance(task)
        finally:
            gc.callbacks.remove(pauses)
        with _Timers() as timers:  # one more pass of polyspec's app, with timers inside it
            for raw in raws:
                await _request(apps["polyspec"], raw)
    inside = {label: {"per_call_us": round(sec / max(1, timers.calls[label]) * 1e6, 2),
                      "calls_per_request": round(timers.calls[label] / len(raws), 3)}
              for label, sec in timers.seconds.items()}
    requests = 2 * rounds * len(raws)
    gc_ms.update(collections_per_1000_requests=[round(1000 * n / requests, 2) for n in pauses.count],
                 pause_ms_per_request=round(sum(pauses.seconds) / requests * 1e3, 4),
                 full_pause_ms_mean=round(pauses.seconds[2] / pauses.count[2] * 1e3, 2) if pauses.count[2] else None)
    diffs = [p - f for p, f in zip(cpu["polyspec"], cpu["floor"], strict=True)]
    return {"cpu_ms": {name: [round(v, 4) for v in vals] for name, vals in cpu.items()},
            "median_ms": {name: round(statistics.median(vals), 4) for name, vals in cpu.items()},
            "own_work_ms": round(statistics.median(diffs), 4), "own_work_range_ms": [round(min(diffs), 4), round(max(diffs), 4)],
            "requests_per_round": len(raws), "rounds": rounds, "gc": gc_ms, "inside_app_us": inside}


def measured_overhead() -> dict[str, Any]:
    """polyspec's, the floor's and vllm-router's CPU per request from the committed bench/router_overhead.py run
    (vllm-router where the run measured it)."""
    path = OUT_DIR / "router_overhead.json"
    if not path.is_file():
        return {}
    d = json.loads(path.read_text())
    out: dict[str, Any] = {"source": "docs/benchmarks/router_overhead.json"}
    for conc, cell in d.get("concurrency", {}).items():
        if "polyspec" in cell and "python_floor" in cell:
            out[conc] = {sys_: {"non_stream": cell[sys_]["cpu_ms_per_req"], "stream": cell[sys_]["stream"]["cpu_ms_per_req"]}
                         for sys_ in ("polyspec", "python_floor", "vllm_router") if sys_ in cell}
    return out


def conclude(stages: dict[str, dict[str, Any]], apps: dict[str, Any] | None, overhead: dict[str, Any]
             ) -> dict[str, Any]:
    """The budget against the router CPU targets (bench/router_overhead.router_targets), non-streamed: polyspec's own
    work at most ``FLOOR_EXCESS_TARGET_MS`` above the floor, of which language ID takes its tight-loop time, and
    polyspec's CPU at most ``CPU_RATIO_TARGET`` times vllm-router's; the floor, polyspec and vllm-router as
    router_overhead.json measured them under load (``overhead``, `measured_overhead`), c = 1 to 256."""
    own_ms = sum(stages[s]["median_us"] for s in OWN_WORK) / 1000
    langid = round(stages["langid"]["median_us"] / 1000, 4)
    cells = [v for k, v in overhead.items() if k != "source"]
    out: dict[str, Any] = {"stages_sum_ms": round(own_ms, 4), "langid_ms": langid,
                           "own_work_target_ms": FLOOR_EXCESS_TARGET_MS, "cpu_ratio_target": CPU_RATIO_TARGET,
                           "left_for_the_rest_ms": round(FLOOR_EXCESS_TARGET_MS - langid, 3)}
    if apps is not None:
        out["app_own_work_ms"] = apps["own_work_ms"]
    if not cells:
        return out

    def span(values: list[float]) -> list[float]:
        return [round(min(values), 3), round(max(values), 3)]

    floors = [c["python_floor"]["non_stream"] for c in cells]
    polyspec = [c["polyspec"]["non_stream"] for c in cells]
    out.update(floor_non_stream_ms=span(floors), measured_polyspec_ms=span(polyspec),
               measured_own_work_ms=span([p - f for p, f in zip(polyspec, floors, strict=True)]))
    if all("vllm_router" in c for c in cells):
        out["vllm_router_ratio_ms"] = span([CPU_RATIO_TARGET * c["vllm_router"]["non_stream"] for c in cells])
    if apps is not None:
        floor_app = apps["median_ms"]["floor"]
        out["server_share_ms"] = span([f - floor_app for f in floors])
    return out


def print_result(stages: dict[str, dict[str, Any]], apps: dict[str, Any], concl: dict[str, Any]) -> None:
    table = Table(title="polyspec's own work per non-streamed request, in-process (us)")
    for col in ("stage", "median", "min", "max"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for name, s in stages.items():
        table.add_row(LABELS[name], f"{s['median_us']:.1f}", f"{s['min_us']:.1f}", f"{s['max_us']:.1f}")
    console.print(table)
    console.print(f"apps in-process, CPU ms per request (median of {apps['rounds']} rounds): {apps['median_ms']}; "
                  f"polyspec - floor {apps['own_work_ms']} (range {apps['own_work_range_ms']}); gc {apps['gc']}")
    console.print(json.dumps(concl))


def main(
    per_lang: int = typer.Option(40, min=1, help="MT-Bench first turns per served language."),
    repeats: int = typer.Option(15, min=3, help="Timed passes over the bodies per stage."),
    rounds: int = typer.Option(6, min=2, help="Alternating rounds of the two apps in-process."),
    quick: bool = typer.Option(False, "--quick", help="Smoke run (5 bodies per language, 3 passes, 2 rounds) "
                                                       "to router_budget_quick.json."),
    conclude_only: bool = typer.Option(False, "--conclude-only",
                                       help="Measure nothing: the committed router_budget.json's conclusion again, on "
                                            "the latest router_overhead.json (after a new run of that bench)."),
) -> None:
    """Time each stage of polyspec's own work per request, in-process, against the router CPU targets."""
    import uvloop

    output = "router_budget.json"
    if conclude_only:
        path = OUT_DIR / output
        if not path.is_file():
            console.print(f"[red]error:[/] {path} does not exist: run the bench first")
            raise typer.Exit(1)
        payload = json.loads(path.read_text())
        payload["router_overhead"] = overhead = measured_overhead()
        payload["conclusion"] = concl = conclude(payload["stages"], payload["apps"], overhead)
        console.print(json.dumps(concl))
        console.print(f"wrote {write_json(output, payload)}")
        return
    if quick:
        per_lang, repeats, rounds, output = 5, 3, 2, "router_budget_quick.json"

    bodies = request_bodies(per_lang)
    with tempfile.TemporaryDirectory(prefix="polyspec-budget-") as tmp:
        backend = None
        try:
            backend = start_backend(Path(tmp), None)
            registry = make_registry(Path(tmp), [("bench", backend.url, SERVED_LANGUAGES, True)])
            response = httpx.post(f"{backend.url}/v1/chat/completions", json=bodies[0], timeout=30).content
            rt = _runtime(registry)
            raw = measure(rt, bodies, response, repeats)
            apps = uvloop.run(measure_apps(registry, backend.url, bodies, rounds))
        except BenchError as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(1) from None
        finally:
            if backend is not None:
                backend.stop()
    stages = {name: summary(samples) for name, samples in raw.items()}
    overhead = measured_overhead()
    concl = conclude(stages, apps, overhead)
    print_result(stages, apps, concl)
    payload = {"benchmark": "router_budget", "bodies": len(bodies), "repeats": repeats, "machine": machine_info(),
               "labels": LABELS, "own_work": list(OWN_WORK), "stages": stages, "apps": apps,
               "router_overhead": overhead, "conclusion": concl}
    console.print(f"wrote {write_json(output, payload)}")


if __name__ == "__main__":
    typer.run(main)
