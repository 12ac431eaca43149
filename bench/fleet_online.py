"""The fleet bench's online prediction (bench/fleet_plan.py): the speed model as each request finds it, with the
live counts of the requests before it, and one engine's calibration merged with its repeat."""

from __future__ import annotations

from typing import Any

from polyspec.core.speed import NO_CONTEXT_COST, ContextCost, request_seconds

Prediction = tuple[float, float, float, ContextCost]  # tokens per step, step s, prefill s per token, context cost
NO_PREDICTION: tuple[None, None, None, ContextCost] = (None, None, None, NO_CONTEXT_COST)


class Online:
    """The speed model as each request finds it, the way a router that has served the requests before it
    predicts: acceptance blends the offline figure (``prior_steps`` steps of evidence, the router's
    prior_spec_steps) with the tokens per step counted on the earlier requests of the same (engine, language);
    the step blends the calibrated one (``prior_requests`` requests, prior_step_requests) with the earlier
    requests' steps on that engine (their seconds less the prefill beyond calibration's prompt, over their steps, brought to calibration's
    context). Nothing of a request enters its own prediction."""

    def __init__(self, model: dict[tuple[str, str], Prediction], prior_steps: int = 2000, prior_requests: int = 20) -> None:
        self.model, self.prior_steps, self.prior_requests = model, prior_steps, prior_requests
        self.counted: dict[tuple[str, str], list[float]] = {}  # (engine, language) -> [tokens, steps]
        self.steps: dict[str, list[float]] = {}  # engine -> [sum of step seconds, requests]

    def seconds(self, row: dict[str, Any], language: str, prompt_tokens: int) -> float | None:
        """The predicted seconds of the answered ``row``, then its own figures join the counts."""
        if not row["ok"] or (row["backend"], language) not in self.model or row["tokens"] <= 0:
            return None
        e_off, step_cal, prefill, context = self.model[(row["backend"], language)]
        tokens, steps = self.counted.get((row["backend"], language), [0.0, 0.0])
        e = (self.prior_steps * e_off + tokens) / (self.prior_steps + steps)
        total, n = self.steps.get(row["backend"], [0.0, 0.0])
        step = (self.prior_requests * step_cal + total) / (self.prior_requests + n)
        seconds = request_seconds(e, step, answer_tokens=row["tokens"], prompt_tokens=prompt_tokens,
                                  prefill_s_per_token=prefill, context=context)
        taken = row["spec_steps"] or row["tokens"]
        if row["spec_steps"]:  # an engine with a draft: its tokens per step
            self.counted[(row["backend"], language)] = [tokens + row["tokens"], steps + taken]
        mean_context = prompt_tokens + row["tokens"] / 2
        own = (row["seconds"] - context.fixed_seconds(prompt_tokens, taken, prefill)) / taken \
            - context.s_per_token * (mean_context - context.measured_at)
        if own > 0:
            self.steps[row["backend"]] = [total + own, n + 1]
        return seconds


def merge_points(first: list[dict[str, Any]], repeat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One engine's calibration and its repeat as one: per batch size the mean step time and tokens/s, the
    requests of both, and the mean of each figure both measured (prefill, context growth, context)."""
    out = []
    again = {p["batch_size"]: p for p in repeat}
    for p in first:
        q = again.get(p["batch_size"])
        if q is None:
            out.append(p)
            continue
        details = dict(p["details"])
        for key in ("prefill_s_per_token", "step_s_per_context_token", "context_tokens", "prompt_tokens", "tokens_per_step",
                    "overhead_s", "decode_step_s", "prefill_s_per_token_pairs", "step_s_per_context_token_pairs"):
            if key in p["details"] and key in q["details"]:
                details[key] = (p["details"][key] + q["details"][key]) / 2
        details["repeat_step_ratio"] = q["step_s"] / p["step_s"]
        out.append({"batch_size": p["batch_size"], "step_s": (p["step_s"] + q["step_s"]) / 2,
                    "tokens_per_s": (p["tokens_per_s"] + q["tokens_per_s"]) / 2,
                    "requests": p["requests"] + q["requests"], "details": details})
    return out
