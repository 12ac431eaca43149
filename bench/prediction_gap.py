"""Why the router's predicted tokens/s runs above the observed (docs/speed.md, "Predicted against observed").

From the committed speed_policy runs' per-request data (docs/benchmarks/speed_policy*_requests.jsonl), with no
engine: per run, a least-squares fit of each request's seconds on its steps and its prompt tokens (the
MT-Bench first turn with the verifier's chat template), for the engines with and without a draft; per language,
tokens per step and seconds per step observed against what the router predicted; and the predicted / observed
ratio before and after counting prefill at core.speed.PREFILL_STEPS_PER_TOKEN verifier-alone steps per prompt
token (core.speed.request_tokens_per_second).

    .venv/bin/python bench/prediction_gap.py [RUN ...]     # default: speed_policy speed_policy_run5 speed_policy_aa speed_policy_run4
    .venv/bin/python bench/prediction_gap.py --fleet [RUN]  # a bench/fleet_plan.py run (default: fleet_plan)
    .venv/bin/python bench/prediction_gap.py --journal docs/benchmarks/fleet_plan_partial_requests.jsonl

With ``--fleet``, per engine: a least-squares fit without intercept of request seconds on steps and prompt
tokens (the prompt tokens each row carries) beside its own calibrated step (the model pools engines of one
shape), measured prefill and step growth per context token; per language, the planned fleet's tokens per step the
model read against those vLLM counted, and its predicted / observed tokens/s, before traffic and online (the model
as each request found it, bench/fleet_online.py).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polyspec.core.settings import get_settings  # noqa: E402
from polyspec.core.speed import PREFILL_STEPS_PER_TOKEN, request_tokens_per_second  # noqa: E402
from polyspec.models.verifiers import prepare_verifier  # noqa: E402
from polyspec.training.benchmarks import load_mtbench  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
RUNS = ("speed_policy", "speed_policy_run5", "speed_policy_aa", "speed_policy_run4")
LANGUAGES = ("en", "fr", "de", "es", "it", "ru")


def prompt_tokens(turns: int = 12) -> dict[str, int]:
    """Prompt id -> tokens of the chat-templated first turn, as the bench sent it."""
    tok = AutoTokenizer.from_pretrained(prepare_verifier(get_settings().default_verifier).path)
    out = {}
    for prompts in load_mtbench(LANGUAGES, turns=(1,), limit=turns).values():
        for p in prompts:
            text = tok.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                           tokenize=False)
            out[p.id] = len(tok(text)["input_ids"])
    return out


def fit(rows: list[dict], plen: dict[str, int]) -> dict[str, dict[str, float]]:
    """seconds = a + b * steps + c * prompt tokens, per kind of engine."""
    out = {}
    for kind in ("plain", "draft"):
        mine = [r for r in rows if r["ok"] and r["prompt_id"] in plen and (r["backend"] == "plain") == (kind == "plain")]
        x = np.array([[1, r["spec_steps"] or r["tokens"], plen[r["prompt_id"]]] for r in mine], float)
        y = np.array([r["seconds"] for r in mine])
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        r2 = 1 - float(((y - x @ coef) ** 2).sum() / ((y - y.mean()) ** 2).sum())
        out[kind] = {"requests": len(mine), "fixed_s": round(float(coef[0]), 3), "ms_per_step": round(coef[1] * 1e3, 1),
                     "ms_per_prompt_token": round(coef[2] * 1e3, 2), "r2": round(r2, 3)}
    return out


def per_language(run: dict, rows: list[dict], plen: dict[str, int]) -> dict[str, dict[str, float]]:
    steps = run.get("engine_steps")
    if not steps:  # older runs kept no step table
        return {}
    plain_step = steps["plain"].get("shared_step_s") or steps["plain"]["calibrated_step_s"]
    prefill = PREFILL_STEPS_PER_TOKEN * plain_step
    out = {}
    for lang in LANGUAGES:
        mine = [r for r in rows if r["language"] == lang and r["system"] == "speed_policy" and r["ok"]
                and r.get("predicted_tps") and r["spec_steps"]]
        if not mine:
            continue
        observed = sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine)
        step = {r["backend"]: steps[r["backend"]].get("shared_step_s") or steps[r["backend"]]["calibrated_step_s"]
                for r in mine}
        predicted = statistics.mean(r["predicted_tps"] for r in mine)
        with_prefill = statistics.mean(
            request_tokens_per_second(r["predicted_tps"] * step[r["backend"]], step[r["backend"]],
                                      answer_tokens=r["tokens"], prompt_tokens=plen[r["prompt_id"]],
                                      prefill_s_per_token=prefill) for r in mine)
        out[lang] = {
            "prompt_tokens": round(statistics.mean(plen[r["prompt_id"]] for r in mine)),
            "tokens_per_step_predicted": round(statistics.mean(r["predicted_tps"] * step[r["backend"]] for r in mine), 2),
            "tokens_per_step_observed": round(sum(r["tokens"] for r in mine) / sum(r["spec_steps"] for r in mine), 2),
            "ms_per_step_calibrated": round(statistics.mean(step.values()) * 1e3, 1),
            "ms_per_step_observed": round(sum(r["seconds"] for r in mine) / sum(r["spec_steps"] for r in mine) * 1e3, 1),
            "predicted_over_observed": round(predicted / observed, 3),
            "with_prefill_over_observed": round(with_prefill / observed, 3)}
    return out


def fleet_gap(run: dict, rows: list[dict]) -> dict[str, dict]:
    """Per engine the fitted step and prefill against the calibration; per language of the planned fleet the
    tokens per step read against counted, and predicted / observed seconds."""
    calibration = {c["deployment"]: c["points"][0] for c in run["calibration"]}
    engines = {}
    for name, point in sorted(calibration.items()):
        mine = [r for r in rows if r["ok"] and r["backend"] == name]
        if len(mine) < 3:
            continue
        x = np.array([[r["spec_steps"] or r["tokens"], r["prompt_tokens"]] for r in mine], float)
        coef = np.linalg.lstsq(x, np.array([r["seconds"] for r in mine]), rcond=None)[0]
        engines[name] = {"requests": len(mine), "ms_per_step_fit": round(coef[0] * 1e3, 1),
                         "ms_per_step_calibrated": round(point["step_s"] * 1e3, 1),
                         "ms_per_prompt_token_fit": round(coef[1] * 1e3, 2),
                         "ms_per_prompt_token_calibrated": round(point["details"]["prefill_s_per_token"] * 1e3, 2)
                         if "prefill_s_per_token" in point.get("details", {}) else None,
                         "ms_per_context_token_calibrated": round(point["details"]["step_s_per_context_token"] * 1e3, 4)
                         if "step_s_per_context_token" in point.get("details", {}) else None,
                         "repeat_over_first_step": round(point["details"]["repeat_step_ratio"], 3)
                         if "repeat_step_ratio" in point.get("details", {}) else None}
    languages = {}
    for lang in run["settings"]["languages"]:
        mine = [r for r in rows if r["ok"] and r["language"] == lang and r["system"] == "planned_fleet"
                and r.get("predicted_seconds")]
        if not mine:
            continue
        steps = sum(r["spec_steps"] or r["tokens"] for r in mine)
        languages[lang] = {
            "engines": sorted({r["backend"] for r in mine}),
            "tokens_per_step_model": round(statistics.mean(r["model_tokens_per_step"] for r in mine), 3),
            "tokens_per_step_counted": round(sum(r["tokens"] for r in mine) / steps, 3),
            "predicted_over_observed": round(sum(r["seconds"] for r in mine) / sum(r["predicted_seconds"] for r in mine), 3),
            "online_over_observed": round(sum(r["seconds"] for r in mine) / sum(r["predicted_seconds_online"] for r in mine), 3)
            if all(r.get("predicted_seconds_online") for r in mine) else None}
    return {"engines": engines, "languages": languages}


def journal_gap(rows: list[dict]) -> dict[str, dict]:
    """Per language, from a fleet bench's request journal alone (a run that stopped before writing its JSON): the
    planned fleet's rounds that every language completed, its predicted / observed tokens/s before traffic and
    online, tokens per step read and counted, and the observed tokens/s with its 95 % interval over prompts."""
    from bench.fleet_figures import tps_interval

    last = min(max(r["round"] for r in rows if r["language"] == lang) for lang in {r["language"] for r in rows})
    whole = [r for r in rows if r["round"] < last and r["system"] == "planned_fleet" and r["ok"]]
    out = {}
    for lang in dict.fromkeys(r["language"] for r in whole):
        mine = [r for r in whole if r["language"] == lang and r.get("predicted_seconds")]
        tokens, seconds = sum(r["tokens"] for r in mine), sum(r["seconds"] for r in mine)
        out[lang] = {"rounds": len(mine), "engines": sorted({r["backend"] for r in mine}),
                     "observed_tps": round(tokens / seconds, 2), "observed_tps_ci95": tps_interval(mine),
                     "predicted_over_observed": round(seconds / sum(r["predicted_seconds"] for r in mine), 3),
                     "online_over_observed": round(seconds / sum(r["predicted_seconds_online"] for r in mine), 3),
                     "tokens_per_step_model": round(statistics.mean(r["model_tokens_per_step"] for r in mine), 3),
                     "tokens_per_step_counted": round(tokens / sum(r["spec_steps"] or r["tokens"] for r in mine), 3)}
    return out


def main(runs: list[str]) -> None:
    if runs and runs[0] == "--journal":
        rows = [json.loads(line) for line in Path(runs[1]).read_text().splitlines() if line]
        print(json.dumps({"journal": runs[1], "languages": journal_gap(rows)}, indent=1))
        return
    if runs and runs[0] == "--fleet":
        name = runs[1] if len(runs) > 1 else "fleet_plan"
        run = json.loads((DOCS / f"{name}.json").read_text())
        rows = [json.loads(line) for line in (DOCS / f"{name}_requests.jsonl").read_text().splitlines() if line]
        print(json.dumps({"run": name, **fleet_gap(run, rows)}, indent=1))
        return
    plen = prompt_tokens()
    for name in runs:
        run = json.loads((DOCS / f"{name}.json").read_text())
        rows = [json.loads(line) for line in (DOCS / f"{name}_requests.jsonl").read_text().splitlines() if line]
        print(json.dumps({"run": name, "fit": fit(rows, plen), "languages": per_language(run, rows, plen)}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:] or list(RUNS))
