"""Choose the fleet for N engine slots (`polyspec deploy plan --engines N`; objective and limits: docs/speed.md).

Candidates are every active draft of the verifier at k = 1..MAX_PLAN_K (multilingual, base, specialists, domain
drafts alike) and no speculation. For each (language x domain) cell of the traffic, a candidate's predicted
tokens/s of one stream is, prefill included (core.speed.request_tokens_per_second),

    tps(d, c) = A / ((P - P_d) * prefill + (A / E_d,c) * step_d(b))

with A answer tokens, P prompt tokens, P_d the prompt tokens calibration's chat turns held (their prefill is in
step_d), step_d(b) at the request's mean context P + A/2 (calibration measures the step's growth per context
token), E from the draft's offline acceptance on the language blended with the
live counters of (language, domain, draft), and step_d(b) the step time at the batch b each replica runs
(b = max(1, concurrency * its traffic share / replicas)). The objective is the traffic-weighted mean

    W = sum_c share_c * max_(d in fleet) tps(d, c)

each cell going to the fleet's fastest deployment for it, as the speed policy routes. A plan with n engines is
found exhaustively over sets of distinct candidates when they are few, greedily (then improved by swaps)
otherwise; replicas only help when a replica's batch exceeds 1, so at concurrency 1 an extra engine is a new
deployment or nothing. Engines are added while one adds at least MIN_GAIN of W.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from polyspec.core.speed import (
    NO_CONTEXT_COST, PREFILL_STEPS_PER_TOKEN, AcceptanceEstimate, ContextCost, blend_acceptance, draft_step, interpolate,
    mean_context_cost, request_tokens_per_second,
)
from polyspec.registry.fleet_plan import Cell, CellPrediction, FleetPlan, Marginal, PlanEntry, PlanError
from polyspec.registry.records import LiveStatRecord

MAX_PLAN_K = 5
# An engine must add at least this share of the weighted tokens/s to be planned. It costs memory (3-3.5 GiB of
# the bundled verifier) and a start, and a smaller gain is within what the model's inputs cannot resolve: engines
# of one shape calibrate several percent apart, and acceptance comes from tens of non-degenerate prompts.
MIN_GAIN = 0.01
EXHAUSTIVE_SETS = 5000  # above this many sets of distinct candidates, search greedily
PRIOR_SPEC_STEPS = 2000  # offline acceptance counts as this many live steps (RouterConfig.prior_spec_steps)
# Without a calibrated engine, the step times of the committed speed_policy run (docs/speed.md, 2 CPU cores,
# the bundled 135M verifier): the verifier alone, and its k = 3 engines with 8,192-row draft heads (their shape).
PRIOR_PLAIN_STEP_S = 0.0634
PRIOR_DRAFT_STEP_S = 0.0954
PRIOR_DRAFT = (3, 8192)
# The draft's decoder layer in rows of its head: the shipped drafts' weights are 19.7 MB with 8,192 rows and
# 24.5 MB with 12,288 (hidden 576, bf16: 1,152 bytes a row), so the layer and the rest weigh 8,940 rows.
DRAFT_LAYER_ROWS = 8940.0


@dataclass(frozen=True)
class Candidate:
    name: str
    draft: str | None  # "name@version"; None: no speculation
    k: int
    vocab: int | None
    domain: str = "general"
    languages: tuple[str, ...] = ()


@dataclass
class Inputs:
    """What the speed model needs for every candidate: acceptance per (draft, language) and per live cell,
    and step-time curves (batch -> seconds) measured per (draft vocabulary, k), None for no speculation."""

    offline: Mapping[str, Mapping[str, list[float]]]  # draft ref -> language -> per-position rates
    offline_samples: Mapping[str, Mapping[str, int]]
    live: Mapping[tuple[str, str, str], LiveStatRecord]  # (language, domain, draft ref) -> counters
    curves: Mapping[tuple[int | None, int], dict[int, float]]  # (vocab, k) -> step curve; (None, 0): plain
    prefill: Mapping[tuple[int | None, int], float] = field(default_factory=dict)  # (vocab, k) -> s per prompt token
    context: Mapping[tuple[int | None, int], ContextCost] = field(default_factory=dict)  # (vocab, k) -> step growth
    answer_tokens: int = 96
    prompt_tokens: int = 110
    concurrency: float = 1.0
    calibrated: bool = field(default=True)


def step_curve(inputs: Inputs, cand: Candidate) -> dict[int, float]:
    """The candidate's batch -> step seconds: its own (vocab, k) calibration, else derived from the closest
    calibrated draft engine and the verifier alone (core.speed.draft_step), else the prior figures."""
    plain = inputs.curves.get((None, 0)) or {1: PRIOR_PLAIN_STEP_S}
    if cand.draft is None:
        return dict(plain)
    own = inputs.curves.get((cand.vocab, cand.k))
    if own:
        return dict(own)
    measured = [(key, curve) for key, curve in inputs.curves.items() if key[0] is not None and curve]
    if measured:
        (vocab, k0), ref = min(measured, key=lambda kv: (kv[0][0] != cand.vocab, abs(kv[0][1] - cand.k)))
    else:
        (k0, vocab), ref = PRIOR_DRAFT, {1: PRIOR_DRAFT_STEP_S}
    return {b: draft_step(interpolate(plain, b) or PRIOR_PLAIN_STEP_S, s, k=cand.k, ref_k=k0,
                          vocab=cand.vocab or vocab, ref_vocab=vocab, layer_vocab=DRAFT_LAYER_ROWS)
            for b, s in ref.items()}


def prefill_cost(inputs: Inputs, cand: Candidate, plain_step_s: float) -> float:
    """Seconds per prompt token on the candidate's engine: its own (vocab, k) calibration's prefill figure;
    else, for a draft engine, the mean of those measured with its draft vocabulary (prefill runs the draft
    over the prompt once, whatever k), else of every measured draft engine; else PREFILL_STEPS_PER_TOKEN
    verifier-alone steps."""
    measured = inputs.prefill
    key = (cand.vocab, cand.k) if cand.draft is not None else (None, 0)
    if key in measured:
        return measured[key]
    if cand.draft is not None:
        for same in ([v for (vocab, k), v in measured.items() if k and vocab == cand.vocab],
                     [v for (_, k), v in measured.items() if k]):
            if same:
                return sum(same) / len(same)
    return PREFILL_STEPS_PER_TOKEN * plain_step_s


def context_cost(inputs: Inputs, cand: Candidate) -> ContextCost:
    """The step's growth per context token on the candidate's engine: its own (vocab, k) calibration's; else the
    mean of those measured with its draft vocabulary, else of every measured engine (the verifier's attention
    is most of it, whatever the draft); else none (the step as calibrated, whatever the context)."""
    measured = inputs.context
    key = (cand.vocab, cand.k) if cand.draft is not None else (None, 0)
    if key in measured:
        return measured[key]
    for same in ([v for (vocab, k), v in measured.items() if k and vocab == cand.vocab and cand.draft is not None],
                 list(measured.values())):
        if same:
            return mean_context_cost(same)
    return NO_CONTEXT_COST


def estimate(inputs: Inputs, cand: Candidate, cell: Cell) -> AcceptanceEstimate:
    if cand.draft is None:
        return AcceptanceEstimate((), 0.0, 0)
    row = inputs.live.get((cell.language, cell.domain, cand.draft))
    est = blend_acceptance(inputs.offline.get(cand.draft, {}).get(cell.language),
                           inputs.offline_samples.get(cand.draft, {}).get(cell.language, 0), PRIOR_SPEC_STEPS,
                           row.accepted_per_pos if row else (), row.num_spec_steps if row else 0,
                           row.requests if row else 0)
    return est or AcceptanceEstimate((), 0.0, 0)


class Model:
    """Predicted tokens/s per (candidate, cell, batch), cached."""

    def __init__(self, inputs: Inputs, candidates: Sequence[Candidate], cells: Sequence[Cell]) -> None:
        self.inputs, self.candidates, self.cells = inputs, list(candidates), list(cells)
        self.curves = {c.name: step_curve(inputs, c) for c in self.candidates}
        plain = self.curves.get("no-spec") or inputs.curves.get((None, 0)) or {1: PRIOR_PLAIN_STEP_S}
        plain_s = interpolate(plain, 1) or PRIOR_PLAIN_STEP_S
        self.prefills = {c.name: prefill_cost(inputs, c, plain_s) for c in self.candidates}
        self.prefill = prefill_cost(inputs, Candidate("no-spec", None, 0, None), plain_s)  # the verifier alone's
        self.contexts = {c.name: context_cost(inputs, c) for c in self.candidates}
        self.context = context_cost(inputs, Candidate("no-spec", None, 0, None))  # the verifier alone's
        self.expected = {(c.name, x.key): estimate(inputs, c, x).mean(c.k) if c.draft else 1.0
                         for c in self.candidates for x in self.cells}
        self._tps: dict[tuple[str, str, float], float] = {}

    def step(self, cand: Candidate, batch: float) -> float:
        return interpolate(self.curves[cand.name], batch) or PRIOR_PLAIN_STEP_S

    def tps(self, cand: Candidate, cell: Cell, batch: float = 1.0) -> float:
        key = (cand.name, cell.key, batch)
        if key not in self._tps:
            self._tps[key] = self._predict(cand, cell, batch)
        return self._tps[key]

    def _predict(self, cand: Candidate, cell: Cell, batch: float) -> float:
        return request_tokens_per_second(self.expected[(cand.name, cell.key)], self.step(cand, batch),
                                         answer_tokens=self.inputs.answer_tokens,
                                         prompt_tokens=self.inputs.prompt_tokens,
                                         prefill_s_per_token=self.prefills[cand.name],
                                         context=self.contexts[cand.name]) or 0.0

    def assign(self, fleet: Mapping[str, int]) -> tuple[float, dict[str, tuple[Candidate, float]]]:
        """The weighted tokens/s of a fleet (candidate name -> replicas) and each cell's (deployment, tps):
        cells go to the fastest deployment at batch 1, then are re-placed once at the batches that load gives."""
        chosen = [c for c in self.candidates if c.name in fleet]
        batch = {c.name: 1.0 for c in chosen}
        best: dict[str, tuple[Candidate, float]] = {}
        for _ in range(2):
            best = {x.key: max(((c, self.tps(c, x, batch[c.name])) for c in chosen), key=lambda ct: ct[1])
                    for x in self.cells}
            load = {c.name: 0.0 for c in chosen}
            for x in self.cells:
                load[best[x.key][0].name] += x.share
            batch = {n: max(1.0, self.inputs.concurrency * load[n] / fleet[n]) for n in load}
        total = sum(x.share * best[x.key][1] for x in self.cells)
        return total, best


def _prune(model: Model) -> list[Candidate]:
    """Drop candidates that another is at least as fast as on every cell (at batch 1)."""
    rows = {c.name: [model.tps(c, x) for x in model.cells] for c in model.candidates}
    keep = []
    for i, c in enumerate(model.candidates):
        dominated = any(all(a >= b for a, b in zip(rows[o.name], rows[c.name], strict=True))
                        and (rows[o.name] != rows[c.name] or j < i)
                        for j, o in enumerate(model.candidates) if o.name != c.name)
        if not dominated:
            keep.append(c)
    return keep


def _best_fleet(model: Model, pool: list[Candidate], n: int, start: dict[str, int]) -> dict[str, int]:
    """The best fleet of exactly n engines (distinct sets exhaustively when few, else greedy then swaps)."""
    def value(fleet: Mapping[str, int]) -> float:
        return model.assign(fleet)[0]

    distinct = min(n, len(pool))
    options: list[dict[str, int]] = []
    if _comb(len(pool), distinct) <= EXHAUSTIVE_SETS:
        options = [{c.name: 1 for c in combo} for combo in itertools.combinations(pool, distinct)]
    else:
        fleet = dict(start)
        while sum(fleet.values()) < distinct:
            fleet = max(({**fleet, c.name: 1} for c in pool if c.name not in fleet), key=value)
        improved = True
        while improved:  # swap one member for one outside while that helps
            improved = False
            for out, new in itertools.product(list(fleet), [c.name for c in pool if c.name not in fleet]):
                trial = {**{k: v for k, v in fleet.items() if k != out}, new: fleet[out]}
                if value(trial) > value(fleet) * (1 + 1e-9):
                    fleet, improved = trial, True
                    break
        options = [fleet]
    best = max(options, key=value)
    while sum(best.values()) < n:  # slots beyond the distinct candidates: replicas
        best = max(({**best, name: best[name] + 1} for name in best), key=value)
    return best


def _comb(n: int, r: int) -> int:
    return math.comb(n, r) if 0 <= r <= n else 0


def plan_fleet(*, verifier: str, engines: int, cells: Sequence[Cell], candidates: Sequence[Candidate],
               inputs: Inputs) -> FleetPlan:
    """The plan for up to ``engines`` slots; ``marginal`` goes one engine further, to say what it would add."""
    if engines < 1:
        raise PlanError(f"--engines must be at least 1, not {engines}")
    if not candidates:
        raise PlanError("no candidate deployment: the registry has no active draft, and no speculation was excluded")
    model = Model(inputs, candidates, cells)
    pool = _prune(model)
    fleets: list[dict[str, int]] = []
    marginal: list[Marginal] = []
    previous = 0.0
    for n in range(1, engines + 2):
        fleet = _best_fleet(model, pool, n, fleets[-1] if fleets else {})
        value = model.assign(fleet)[0]
        added = next((name for name in fleet if fleet[name] > (fleets[-1] if fleets else {}).get(name, 0)),
                     next(iter(fleet)))
        if value - previous < MIN_GAIN * max(previous, 1e-9):
            added = "-"  # no engine more adds speed: which one fills the slot is arbitrary
        marginal.append(Marginal(engines=n, weighted_tps=round(value, 3), added_tps=round(value - previous, 3),
                                 added=added))
        fleets.append(fleet)
        previous = value
    chosen_n = 1
    for n in range(2, engines + 1):
        if marginal[n - 1].added_tps >= MIN_GAIN * marginal[n - 2].weighted_tps:
            chosen_n = n
        else:
            break
    return _as_plan(model, verifier, engines, fleets[chosen_n - 1], marginal, inputs)


def _as_plan(model: Model, verifier: str, engines: int, fleet: dict[str, int], marginal: list[Marginal],
             inputs: Inputs) -> FleetPlan:
    total, best = model.assign(fleet)
    plain_cand = next((c for c in model.candidates if c.draft is None), Candidate("no-spec", None, 0, None))
    predicted, served = [], {}
    for x in model.cells:
        cand, tps = best[x.key]
        plain = model.tps(plain_cand, x)
        served.setdefault(cand.name, []).append(x.language)
        predicted.append(CellPrediction(
            language=x.language, domain=x.domain, share=x.share, entry=cand.name, draft=cand.draft, k=cand.k,
            tokens_per_step=round(model.expected[(cand.name, x.key)], 4), step_ms=round(model.step(cand, 1) * 1e3, 2),
            tps=round(tps, 3), plain_tps=round(plain, 3), speedup=round(tps / plain, 3) if plain else 0.0))
    plain_total = sum(p.share * p.plain_tps for p in predicted)
    shares = {name: sum(x.share for x in model.cells if best[x.key][0].name == name) for name in fleet}
    default = max(fleet, key=lambda name: (shares[name], name))
    entries = [PlanEntry(name=c.name, draft=c.draft, draft_vocab_size=c.vocab, k=c.k, replicas=fleet[c.name],
                         languages=sorted(set(served.get(c.name, []))), default=c.name == default)
               for c in model.candidates if c.name in fleet]
    return FleetPlan(
        verifier=verifier, engines=engines, entries=entries, traffic=list(model.cells), predicted=predicted,
        weighted_tps=round(total, 3), plain_weighted_tps=round(plain_total, 3),
        speedup=round(total / plain_total, 3) if plain_total else 0.0, marginal=marginal,
        assumptions={"answer_tokens": inputs.answer_tokens, "prompt_tokens": inputs.prompt_tokens,
                     "prefill_ms_per_token": round(model.prefill * 1e3, 3),
                     "prefill": "calibrated" if inputs.prefill else "prior (no engine's prefill measured)",
                     "context_ms_per_token": round(model.context.s_per_token * 1e3, 4),
                     "concurrency": inputs.concurrency,
                     "step_times": "calibrated" if inputs.calibrated else "prior (no calibrated engine)",
                     "objective": "sum over cells of share x predicted tokens/s of one stream"})
