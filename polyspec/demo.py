"""`make demo` / `polyspec demo`: from a fresh clone to a planned, routed, measured deployment.

1. Prepare the bundled verifier (SmolLM2-135M-Instruct) and register it.
2. If no active English / French draft exists for it, train a small one per language on CPU with the
   training pipeline (MT-Bench turns bundled in training/data/mtbench; the questions the demo sends
   later are held out of training), then register and promote it. The shipped multilingual draft is
   imported beside them (polyspec/fleet/demo.py).
3. Plan the fleet for the demo's traffic (EN, FR, IT, JA alike) on the engines free memory holds
   (`polyspec deploy plan`'s search, docs/speed.md), deploy exactly that plan, and `polyspec up
   --calibrate` it: each engine calibrated for the speed policy, plus the router.
4. Send held-out MT-Bench EN, FR, IT and JA turns through the router with the `openai` client; print each
   routing decision, a per-language acceptance table (live vs offline) and the speed table: per language
   the engine the speed policy chose, the plan's prediction, the router's predicted and the observed
   tokens/s, and the speed-up over no speculation. Italian and Japanese have no specialist deployed;
   Japanese has none at all, and the multilingual draft serves it. The no-speculation figures come from the same
   prompts sent, before the fleet starts, to one engine of the verifier alone with the fleet engines' CPU
   share (`plain_baseline`; `--no-baseline` skips it): run beside the fleet it would be a third engine,
   and with the test suite's shared engines five would not fit in 24 GB.
5. Leave the dashboard running until Ctrl-C (or stop at once with --no-wait, as CI does).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import typer
from openai import OpenAI
from rich.table import Table

import polyspec.training as training
from polyspec.core.console import console
from polyspec.core.counters import SpecCounts
from polyspec.core.ports import free_port
from polyspec.core.settings import get_settings
from polyspec.fleet.demo import PREFIX, ensure_multilingual, plan_demo_fleet, planned_tps
from polyspec.fleet.from_plan import serve_plan
from polyspec.fleet.plan import FleetError
from polyspec.fleet.run import run_up, share_cpus
from polyspec.models.shipped import pull_command, shipped_for_language
from polyspec.models.verifiers import prepare_verifier
from polyspec.models.vllm_engine import EngineError, EngineSpec, VllmEngine
from polyspec.registry import open_registry
from polyspec.registry.errors import PromotionRefused
from polyspec.registry.fleet_plan import PlanError
from polyspec.training.config import RunConfig
from polyspec.training.pipeline import run_pipeline, start_run

LANGUAGES = ("en", "fr")
# Traffic: the two languages with a specialist, and two without one (Japanese has none at all), which the plan
# and the speed policy send where they are fastest.
TRAFFIC = (*LANGUAGES, "it", "ja")
# The first 2 questions of each MT-Bench category (16 of 80) are held out of training. They are exactly
# what the training pipeline's MT-Bench evaluation takes with a limit of 16 (categories interleaved),
# so the offline figures and the demo's live traffic both come from prompts the draft never saw.
HOLDOUT_PER_CATEGORY = 2
CATEGORIES = 8
HELD_OUT = HOLDOUT_PER_CATEGORY * CATEGORIES
# Kept small so both drafts train in minutes on 2 CPU cores; a real run uses the founding recipe.
DEMO_ANSWER_TOKENS = 128
EVAL_QUESTIONS = 8  # one per MT-Bench category
DEMO_FIT = {"epochs": 2, "lr": 3e-4, "warmup_steps": 10, "total_seq_len": 2048}
LAUNCH = {"max_model_len": 2048, "kv_cache_gib": 1}  # every demo engine's knobs (small: tests run beside it)


class DemoError(RuntimeError):
    """A demo step failed; the message says which and how to look closer."""


@dataclass
class LangStats:
    """What the demo's client saw of one language: the one counter type, summed per response."""

    counts: SpecCounts = field(default_factory=SpecCounts)
    drafts: dict[str, int] = field(default_factory=dict)  # draft that answered -> requests (the router's header)

    def add(self, spec: dict[str, Any] | None, tokens: int, draft: str | None = None) -> None:
        self.counts = self.counts + SpecCounts.from_vllm_metrics(spec, tokens)
        if draft:
            self.drafts[draft] = self.drafts.get(draft, 0) + 1

    @property
    def main_draft(self) -> str | None:
        """The draft that answered most of this language's requests (the speed policy may pick any)."""
        return max(self.drafts, key=lambda d: (self.drafts[d], d)) if self.drafts else None

    @property
    def mal(self) -> float | None:
        return self.counts.mean_acceptance_length


def _mtbench(lang: str) -> list[dict[str, Any]]:
    path = Path(training.__file__).resolve().parent / "data" / "mtbench" / f"{lang}.jsonl"
    if not path.is_file():
        raise DemoError(f"bundled MT-Bench file missing: {path}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _split(lang: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(held out, categories interleaved; training) questions of one language."""
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for q in _mtbench(lang):
        by_cat.setdefault(q.get("category") or "general", []).append(q)
    held = [qs[i] for i in range(HOLDOUT_PER_CATEGORY) for qs in by_cat.values() if i < len(qs)]
    ids = {q["id"] for q in held}
    return held, [q for qs in by_cat.values() for q in qs if q["id"] not in ids]


def heldout_turns(lang: str, questions: int) -> list[str]:
    """First turns of the first ``questions`` held-out MT-Bench questions (never used for training)."""
    return [q["turns"][0] for q in _split(lang)[0][:questions]]


def demo_prompts(lang: str, out_dir: Path, limit: int) -> Path:
    """Training prompts: both turns of every MT-Bench question that is not held out (64 x 2 per language)."""
    turns = [t for q in _split(lang)[1] for t in q["turns"]][:limit]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"prompts-{lang}.jsonl"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({"prompt": t}, ensure_ascii=False) + "\n" for t in turns), encoding="utf-8")
    tmp.replace(path)
    return path


def _console() -> Any:
    return console()


# --- step 2: drafts ---------------------------------------------------------------------------------
def ensure_drafts(reg: Any, verifier: Any, console: Any, *, prompts_per_language: int,
                  use_shipped: bool = True) -> dict[str, str]:
    """An active draft per demo language ('name@version').

    In order: an active draft already in the registry; the shipped draft for that language, from the
    checkout's models/drafts/ or pulled into POLYSPEC_HOME/drafts (models.shipped; trained on the H200, imported with its recorded evaluations and put through the
    promotion gate); otherwise one trained here on CPU (English from scratch, French fine-tuned from it,
    the founding recipe in small)."""
    refs: dict[str, str] = {}
    for lang in LANGUAGES:
        active = reg.drafts(verifier=verifier.name, language=lang, status="active")
        if active:
            refs[lang] = active[-1].ref
            console.print(f"[green]✓[/] active {lang} draft in the registry: {refs[lang]}")
            continue
        # the draft made for this language alone: the multilingual draft, best on French by measured
        # acceptance, is made for nine languages, and the gate would weigh it on all nine and retire the
        # English base it supersedes (registry.promotion)
        shipped = shipped_for_language(verifier.name, lang, specialist=True) if use_shipped else None
        if shipped is not None:
            refs[lang] = install_shipped(reg, shipped, console)
            continue
        console.print(f"[yellow]•[/] no active {lang} draft for {verifier.name}: training one on CPU"
                      + ("" if not use_shipped else f" (to skip this, `{pull_command(f'{verifier.name}-{lang}')}`)"))
        started = time.monotonic()
        ref = train_demo_draft(lang, verifier, parent=refs.get("en") if lang != "en" else None,
                               prompts_per_language=prompts_per_language)
        console.print(f"  trained and registered {ref} in {time.monotonic() - started:.0f} s")
        promote_for_demo(reg, ref, console)
        refs[lang] = ref
    return refs


def install_shipped(reg: Any, shipped: Any, console: Any) -> str:
    """Import a shipped draft (checksums verified) with its evaluations, then promote it through the gate."""
    shipped.verify()
    known = [d for d in reg.drafts(verifier=shipped.verifier) if d.name == shipped.name
             and d.checksums == shipped.checksums]
    if known:
        ref = known[-1].ref
    else:
        parent = next((d.ref for d in reg.drafts(verifier=shipped.verifier) if d.name == shipped.parent), None)
        record = reg.import_draft(shipped.path, verifier=shipped.verifier, name=shipped.name,
                                  languages=shipped.languages, parent=parent, provenance=shipped.provenance)
        ref = record.ref
        for row in shipped.evaluations:
            reg.add_evaluation(ref, **row)
    console.print(f"[green]✓[/] shipped draft {ref} imported (sha256 verified, {len(shipped.evaluations)} evaluations)")
    promote_for_demo(reg, ref, console)
    return ref


def promote_for_demo(reg: Any, ref: str, console: Any) -> None:
    """The registry's promotion gate; a refusal is shown with its numbers, then overridden (demo only)."""
    try:
        result = reg.promote(ref)
        console.print(f"  promoted {ref} (gate passed)")
    except PromotionRefused as exc:
        console.print(f"  [yellow]{exc}[/]\n  the demo promotes it anyway (force) so that it can be served")
        result = reg.promote(ref, force=True)
    for row in headline_comparisons(result.comparisons, reg.get_draft(ref).languages):
        against = f"{row['baseline']}, {row.get('benchmark')}, {row.get('method')}" if row.get("baseline") else "no incumbent"
        console.print(f"    {row.get('language')}: {row.get('before')} → {row.get('after')} ({against})", markup=False)


def headline_comparisons(rows: list[dict[str, Any]], languages: list[str]) -> list[dict[str, Any]]:
    """The gate's comparisons worth a line in the demo: the draft's languages and English, on the vLLM
    benchmark when there is one (a shipped draft carries offline benchmarks in 9 languages too)."""
    wanted = [r for r in rows if r.get("language") in {*languages, "en"}]
    vllm = [r for r in wanted if (r.get("benchmark"), r.get("method")) == ("mtbench", "vllm")]
    return vllm or wanted


def train_demo_draft(lang: str, verifier: Any, *, parent: str | None, prompts_per_language: int) -> str:
    """Run the training pipeline on the bundled demo prompts; returns the registered draft reference."""
    prompts_file = demo_prompts(lang, get_settings().home / "demo", limit=prompts_per_language)
    cfg = RunConfig.model_validate({
        "run_id": f"demo-{lang}-{time.strftime('%Y%m%d-%H%M%S')}", "language": lang, "verifier": verifier.name,
        "mode": "finetune" if parent else "from-scratch", "parent_draft": parent,
        "prompts": {"files": [str(prompts_file)], "heldout_fraction": 0.1},
        "answers": {"max_new_tokens": DEMO_ANSWER_TOKENS},
        "fit": DEMO_FIT,
        # MT-Bench with a limit <= HELD_OUT takes held-out questions only (see HOLDOUT_PER_CATEGORY). The
        # parent is measured on the same prompts only for the fine-tune: that is the gate's baseline.
        "eval": {"k": 3, "languages": [lang], "mtbench_max_questions": EVAL_QUESTIONS, "max_new_tokens": 64,
                 "heldout_max_prompts": EVAL_QUESTIONS // 2, "evaluate_parent": parent is not None},
        "registration": {"draft_name": f"demo-{lang}"},
    })
    summaries = run_pipeline(start_run(cfg))
    return summaries["register"]["draft"]


# --- step 4: traffic ---------------------------------------------------------------------------------
def send_traffic(base: str, questions: int, max_tokens: int, console: Any,
                 speed: list[dict[str, Any]]) -> dict[str, LangStats]:
    """Held-out MT-Bench turns through the router; prints one row per routing decision."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # /ready: the router's table has a healthy engine
        try:
            if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    client = OpenAI(base_url=f"{base}/v1", api_key="not-needed", timeout=600, max_retries=0)
    table = Table(title="Routing decisions (held-out MT-Bench turns)")
    for col in ("prompt", "language", "confidence", "backend", "draft", "tokens", "accept. length"):
        table.add_column(col, justify="right" if col in ("confidence", "tokens", "accept. length") else "left",
                         no_wrap=True)
    stats = {lang: LangStats() for lang in TRAFFIC}
    for lang in TRAFFIC:
        for text in heldout_turns(lang, questions):
            started = time.perf_counter()
            raw = client.chat.completions.with_raw_response.create(
                model="polyspec", messages=[{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0,
                extra_headers={"X-Polyspec-Explain": "1"})
            seconds = time.perf_counter() - started
            body = json.loads(raw.http_response.text)
            spec = (body.get("metrics") or {}).get("speculative_decoding")
            tokens = int((body.get("usage") or {}).get("completion_tokens", 0))
            h = raw.headers
            stats.setdefault(h.get("x-polyspec-language", "?"), LangStats()).add(spec, tokens, h.get("x-polyspec-draft"))
            speed.append({"language": lang, "text": text, "backend": h.get("x-polyspec-backend", "?"),
                          "predicted_tps": float(h.get("x-polyspec-predicted-tps") or 0) or None,
                          "tokens": tokens, "seconds": seconds})
            mal = f"{spec['mean_acceptance_length']:.2f}" if spec else "-"
            table.add_row(text[:48] + ("…" if len(text) > 48 else ""), h.get("x-polyspec-language", "?"),
                          h.get("x-polyspec-confidence", "?"), h.get("x-polyspec-backend", "?"),
                          h.get("x-polyspec-draft", "?"), str(tokens), mal)
            console.print(f"  {lang}: {text[:60]!r} → {h.get('x-polyspec-backend')} ({h.get('x-polyspec-draft')})",
                          soft_wrap=True, markup=False)
    console.print(table)
    return stats


def plain_baseline(verifier_path: str | Path, questions: int, max_tokens: int, engines: int, console: Any) -> dict[str, tuple[int, float]]:
    """Each demo prompt on one vLLM engine of the verifier alone: prompt text -> (tokens, seconds).

    The engine gets the CPU share each of the fleet's ``engines`` engines gets (`fleet.share_cpus`) and the
    demo's launch knobs, so the figures compare with the fleet's. One untimed request warms it up first, as
    `up --calibrate` warms the fleet's."""
    spec = EngineSpec(**share_cpus({"verifier": verifier_path, "draft": None, "host": "127.0.0.1",
                                    "port": free_port(), **LAUNCH}, engines))
    engine = VllmEngine(spec, get_settings().home / "logs" / "demo-no-speculation.log").start()
    out: dict[str, tuple[int, float]] = {}
    try:
        engine.wait_ready(timeout=900, progress=True)
        with httpx.Client(base_url=engine.url.rstrip("/"), timeout=600) as client:
            def ask(text: str) -> tuple[int, float]:
                started = time.perf_counter()
                resp = client.post("/v1/chat/completions", json={
                    "model": engine.model_name, "messages": [{"role": "user", "content": text}],
                    "max_tokens": max_tokens, "temperature": 0})
                resp.raise_for_status()
                return int(resp.json()["usage"]["completion_tokens"]), time.perf_counter() - started

            ask("Hello! Introduce yourself.")
            for lang in TRAFFIC:
                for text in heldout_turns(lang, questions):
                    out[text] = ask(text)
    except (EngineError, httpx.HTTPError) as exc:
        raise DemoError(f"the no-speculation engine failed: {exc} (log: {engine.log_path}; "
                        "--no-baseline skips it)") from exc
    finally:
        engine.stop()
    console.print(f"[green]✓[/] no-speculation baseline: {len(out)} prompts on the verifier alone")
    return out


def speed_table(rows: list[dict[str, Any]], planned: dict[str, float] | None = None) -> Any:
    """Per language: the engine the speed policy chose, the plan's and the router's predicted tokens/s, the
    observed tokens/s and the speed-up over none."""
    table = Table(title="Speed per language (speed policy; tokens/s of one stream, client-side)")
    for col in ("language", "engine chosen", "plan tok/s", "predicted tok/s", "observed tok/s", "no speculation tok/s",
                "speed-up"):
        table.add_column(col, justify="left" if col in ("language", "engine chosen") else "right")
    for lang in TRAFFIC:
        mine = [r for r in rows if r["language"] == lang]
        if not mine:
            continue
        engines = Counter(r["backend"] for r in mine).most_common()
        predicted = [r["predicted_tps"] for r in mine if r["predicted_tps"]]
        observed = sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine)
        plain = [r["plain"] for r in mine if r.get("plain")]  # (tokens, seconds) from plain_baseline
        base = sum(t for t, _ in plain) / sum(s for _, s in plain) if plain else None
        plan = (planned or {}).get(lang)
        table.add_row(lang, ", ".join(f"{name} ×{n}" for name, n in engines), f"{plan:.1f}" if plan else "-",
                      f"{sum(predicted) / len(predicted):.1f}" if predicted else "-", f"{observed:.1f}",
                      f"{base:.1f}" if base else "-", f"{observed / base:.2f}×" if base else "-")
    return table


def acceptance_table(stats: dict[str, LangStats], reg: Any) -> Any:
    """Per language: the draft(s) that answered it, live acceptance at the k its engine drafts (vLLM reports one
    count per drafted position), and the main draft's offline figure on it, at the k it was evaluated at."""
    # the vLLM figures on the 12 MT-Bench questions are closest to the demo's traffic; any other otherwise
    offline = {(e.draft, e.language): e for e in reg.best_evaluations()}
    offline.update({(e.draft, e.language): e for e in reg.best_evaluations(benchmark="mtbench", method="vllm")})
    depth = max([len(s.counts.accepted_per_pos) for s in stats.values() if s.counts.requests] + [1])
    table = Table(title="Acceptance per language: live through the router at each engine's k vs offline evaluation")
    for col in ("language", "draft", "k", "requests", "tokens", *(f"pos {i}" for i in range(1, depth + 1)),
                "live MAL", "offline MAL (k)"):
        table.add_column(col, justify="left" if col in ("language", "draft") else "right")
    for lang, s in stats.items():
        c = s.counts
        if not c.requests:
            continue
        k = len(c.accepted_per_pos)
        pos = [f"{a:.2f}" if c.num_spec_steps else "-" for a in c.acceptance] + ["-"] * (depth - k)
        main = s.main_draft
        ev = offline.get((main, lang)) if main else None
        drafts = ", ".join(f"{d} ×{n}" for d, n in sorted(s.drafts.items(), key=lambda kv: (-kv[1], kv[0])))
        table.add_row(lang, drafts or "-", str(k) if c.num_spec_steps else "-", str(c.requests),
                      str(c.completion_tokens), *pos, f"{s.mal:.2f}" if s.mal else "-",
                      f"{ev.mean_acceptance_length:.2f} ({ev.k})" if ev else "-")
    return table


# --- the command --------------------------------------------------------------------------------------
def demo(
    no_wait: bool = typer.Option(False, "--no-wait", help="Stop after the traffic instead of serving until Ctrl-C "
                                 "(default when CI is set)."),
    questions: int = typer.Option(4, min=1, max=HELD_OUT, help="Held-out MT-Bench questions per language."),
    max_tokens: int = typer.Option(64, min=1, help="max_tokens of each demo request."),
    prompts_per_language: int = typer.Option(150, min=20, help="Training prompts per language when a draft is trained."),
    train: bool = typer.Option(False, "--train", help="Train the drafts on CPU even where a shipped draft exists."),
    baseline: bool = typer.Option(True, "--baseline/--no-baseline", help="First measure the same prompts on the "
                                  "verifier alone, for the speed-up column (one more engine start)."),
    port: int = typer.Option(8000, help="Router port."),
    base_port: int = typer.Option(8101, help="First engine port."),
) -> None:
    """Plan, deploy and serve a fleet for English, French, Italian and Japanese traffic from the English, French
    and multilingual drafts (shipped ones, or trained here); route held-out MT-Bench turns."""
    console = _console()
    started = time.monotonic()
    no_wait = no_wait or bool(os.environ.get("CI"))
    try:
        verifier = prepare_verifier(get_settings().default_verifier)
        with open_registry() as reg:
            reg.ensure_verifier(verifier.name)
            ensure_drafts(reg, verifier, console, prompts_per_language=prompts_per_language, use_shipped=not train)
            if not train:
                ensure_multilingual(reg, verifier, console, install_shipped)
            fleet_plan = plan_demo_fleet(reg, TRAFFIC, console)
        console.print(f"drafts ready and fleet planned after {time.monotonic() - started:.0f} s")
        plain: dict[str, tuple[int, float]] = {}
        if baseline:
            console.print("measuring the held-out prompts without speculation (the verifier alone)…")
            plain = plain_baseline(verifier.path, questions, max_tokens, engines=fleet_plan.engines_used,
                                   console=console)
        console.print("starting the fleet")
        results: dict[str, Any] = {}

        def traffic(base: str) -> None:
            def worker() -> None:
                try:
                    speed: list[dict[str, Any]] = []
                    results["stats"] = send_traffic(base, questions, max_tokens, console, speed)
                    with open_registry() as reg:
                        console.print(acceptance_table(results["stats"], reg))
                    for row in speed:
                        row["plain"] = plain.get(row["text"])
                    console.print(speed_table(speed, planned_tps(fleet_plan)))
                    console.print(f"[bold]demo took {time.monotonic() - started:.0f} s[/] · dashboard: {base}/admin")
                except Exception as exc:  # reported, then the fleet stops
                    results["error"] = exc
                if no_wait or "error" in results:
                    os.kill(os.getpid(), signal.SIGINT)  # the same clean stop as Ctrl-C
                else:
                    console.print("serving until Ctrl-C")

            threading.Thread(target=worker, daemon=True).start()

        plan = serve_plan(open_registry(), fleet_plan, host="127.0.0.1", port=port, registry_url=None,
                          base_port=base_port, launch=LAUNCH, prefix=PREFIX)
        run_up(plan, logs_dir=get_settings().home / "logs", on_ready=traffic, router_id="demo", calibrate=True)
    except (DemoError, FleetError, PlanError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None
    if "error" in results:
        typer.echo(f"error: demo traffic failed: {results['error']}", err=True)
        raise typer.Exit(1)


def register(root: typer.Typer) -> None:
    """Mount `polyspec demo` (the lead calls this from polyspec/cli.py)."""
    root.command("demo")(demo)


if __name__ == "__main__":
    typer.run(demo)
