"""The dashboard's one JSON document, computed from telemetry counters and registry records.

Pure functions over plain inputs, so the figures the browser draws can be checked without a browser.
Acceptance at position i is P(>= i drafts accepted) = steps that accepted at least i / all spec steps;
mean acceptance length is 1 + accepted draft tokens / spec steps (vLLM's definition).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from polyspec.core.langid import UNDETERMINED
from polyspec.core.counters import SpecCounts
from polyspec.registry.adaptation import summary
from polyspec.router.table import LiveRow

FROM_SCRATCH_PLAN = "from-scratch-custom-vocab"
LANGID_EDGES = [round(i / 10, 1) for i in range(11)]


@dataclass(frozen=True)
class BackendStatus:
    name: str
    url: str
    healthy: bool
    languages: tuple[str, ...] = ()
    domain: str = "general"
    draft: str | None = None
    is_default: bool = False
    detail: str | None = None


@dataclass
class RegistryData:
    """What the dashboard reads from the registry (records from registry.open_registry())."""

    drafts: list[Any] = field(default_factory=list)  # DraftRecord-like
    evaluations: list[Any] = field(default_factory=list)  # EvaluationRecord-like
    profiles: list[Any] = field(default_factory=list)  # LanguageProfileRecord-like
    adaptation: list[Any] = field(default_factory=list)  # AdaptEventRecord-like, oldest first
    error: str | None = None


def draft_key(ref: str | None) -> str:
    """Normalise a draft reference to the registry's 'name@version' ('name:3' -> 'name@3'; 'name' stays)."""
    if not ref:
        return "none"
    head, _, tail = ref.rpartition(":")
    if head and tail.isdigit() and "@" not in ref:
        return f"{head}@{tail}"
    return ref


def _offline_for(offline: dict[tuple[str, str], Any], ref: str, language: str) -> Any:
    """The evaluation of exactly that draft version; a bare name matches its best evaluated version."""
    key = draft_key(ref)
    if "@" in key:
        return offline.get((key, language))
    matches = [ev for (r, lang), ev in offline.items() if lang == language and r.rpartition("@")[0] == key]
    return max(matches, key=lambda ev: ev.mean_acceptance_length, default=None)


def langid_histogram(confidences: Iterable[float], edges: Sequence[float] = LANGID_EDGES) -> list[int]:
    counts = [0] * (len(edges) - 1)
    for c in confidences:
        c = min(max(float(c), edges[0]), edges[-1])
        idx = min(int((c - edges[0]) / (edges[-1] - edges[0]) * len(counts)), len(counts) - 1)
        counts[idx] += 1
    return counts


def _merge(rows: Iterable[LiveRow], language: str, k: int) -> LiveRow:
    """All rows of a language as one, with exactly k positions (the dashboard's columns)."""
    total = sum((r.counts for r in rows), SpecCounts())
    per_pos = (tuple(total.accepted_per_pos[:k]) + (0,) * k)[:k]
    return LiveRow(language, "*", "*", replace(total, accepted_per_pos=per_pos))


def _offline_index(evaluations: Iterable[Any]) -> dict[tuple[str, str], Any]:
    """Best non-live evaluation per (draft 'name@version', language): what live traffic is compared with."""
    best: dict[tuple[str, str], Any] = {}
    for ev in evaluations:
        if getattr(ev, "method", "") == "live":
            continue
        key = (draft_key(ev.draft), ev.language)
        if key not in best or ev.mean_acceptance_length > best[key].mean_acceptance_length:
            best[key] = ev
    return best


def _language_rows(
    live: list[LiveRow], offline: dict, k: int, traffic: Mapping[str, int] | None
) -> list[dict[str, Any]]:
    by_lang: dict[str, list[LiveRow]] = defaultdict(list)
    for r in live:
        by_lang[r.language].append(r)
    # Routed requests per language: the router's decision counter when given (it also counts requests
    # that failed or carried no acceptance figures), else the acceptance rows' request counts.
    requests = dict(traffic) if traffic is not None else {c: sum(r.requests for r in rows) for c, rows in by_lang.items()}
    total = sum(requests.values())
    out = []
    for code in sorted(set(by_lang) | set(requests), key=lambda c: (-requests.get(c, 0), c)):
        rows = by_lang.get(code) or [LiveRow(code, "general", "none")]
        merged = _merge(rows, code, k)
        # Offline reference: the evaluation of the draft that served most of this language's speculative steps.
        main = max(rows, key=lambda r: (r.num_spec_steps, r.requests))
        ev = _offline_for(offline, main.draft, code)
        out.append({
            "code": code,
            "requests": requests.get(code, 0),
            "share": requests.get(code, 0) / total if total else 0.0,
            "completion_tokens": merged.completion_tokens,
            "num_spec_steps": merged.num_spec_steps,
            "acceptance": merged.acceptance if merged.num_spec_steps else None,  # None: not measured
            "mean_acceptance_length": merged.mean_acceptance_length,
            "offline_mean_acceptance_length": ev.mean_acceptance_length if ev else None,
            "offline_acceptance": list(ev.acceptance) if ev else None,
            "main_draft": main.draft,
        })
    return out


def _live_rows(live: list[LiveRow], offline: dict, predicted: Mapping[tuple[str, str], float]) -> list[dict[str, Any]]:
    rows = []
    for r in sorted(live, key=lambda r: (r.language, r.draft, r.domain)):
        ev = _offline_for(offline, r.draft, r.language)
        rows.append({
            "language": r.language, "domain": r.domain, "draft": r.draft, "requests": r.requests,
            "completion_tokens": r.completion_tokens, "num_spec_steps": r.num_spec_steps,
            "acceptance": r.acceptance if r.num_spec_steps else None, "mean_acceptance_length": r.mean_acceptance_length,
            "offline_mean_acceptance_length": ev.mean_acceptance_length if ev else None,
            "offline_benchmark": ev.benchmark if ev else None,
            # completion tokens over engine wall time (live stats' generation_s): what the speed policy targets
            "observed_tps": r.counts.tokens_per_second,
            # the speed model's latest prediction for this language's requests on this draft (this router's)
            "predicted_tps": predicted.get((r.language, r.draft)),
        })
    return rows


def _draft_rows(reg: RegistryData, offline: dict, languages_seen: Iterable[str]) -> list[dict[str, Any]]:
    profiles = {p.language: p for p in reg.profiles}
    by_lang: dict[str, list[Any]] = defaultdict(list)
    for d in reg.drafts:
        for code in d.languages or []:
            by_lang[code].append(d)
    order = {"active": 0, "candidate": 1, "retired": 2}
    out = []
    for code in sorted(set(profiles) | set(by_lang) | set(languages_seen)):
        prof = profiles.get(code)
        drafts = sorted(by_lang.get(code, []), key=lambda d: (order.get(d.status, 9), d.name, -d.version))
        out.append({
            "language": code,
            "name": prof.name if prof else None,
            "script": prof.script if prof else None,
            "plan": prof.plan if prof else None,
            "from_scratch": bool(prof and prof.plan == FROM_SCRATCH_PLAN),
            "reason": prof.reason if prof else None,
            "coverage": prof.coverage if prof else None,
            "drafts": [
                {
                    "name": d.name, "version": d.version, "status": d.status, "domain": d.domain,
                    "draft_vocab_size": d.draft_vocab_size, "k": d.k,
                    "offline_mean_acceptance_length": (
                        ev.mean_acceptance_length if (ev := offline.get((f"{d.name}@{d.version}", code))) else None
                    ),
                }
                for d in drafts
            ],
        })
    return out


def build_summary(
    *,
    router_id: str,
    live: Sequence[LiveRow],
    langid_counts: Sequence[int],
    langid_edges: Sequence[float] = LANGID_EDGES,
    traffic: Mapping[str, int] | None = None,
    backends: Sequence[BackendStatus],
    registry: RegistryData,
    threshold: float | None = None,
    k: int | None = None,
    predicted: Mapping[tuple[str, str], float] | None = None,
) -> dict[str, Any]:
    live = list(live)
    k = k or max([len(r.accepted_per_pos) for r in live] + [d.k for d in registry.drafts] + [3])
    offline = _offline_index(registry.evaluations)
    languages = _language_rows(live, offline, k, traffic)
    overall = _merge(live, "*", k)
    return {
        "router_id": router_id,
        "generated_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "k": k,
        "totals": {
            "requests": sum(lang["requests"] for lang in languages),
            "completion_tokens": overall.completion_tokens,
            "mean_acceptance_length": overall.mean_acceptance_length,
            "languages": len(languages),
            "backends": len(backends),
            "healthy_backends": sum(b.healthy for b in backends),
        },
        "languages": languages,
        "live": _live_rows(live, offline, predicted or {}),
        "langid": {"edges": list(langid_edges), "counts": list(langid_counts), "total": sum(langid_counts), "threshold": threshold},
        "backends": [
            {"name": b.name, "url": b.url, "healthy": b.healthy, "languages": list(b.languages), "domain": b.domain,
             "draft": b.draft, "is_default": b.is_default, "detail": b.detail}
            for b in backends
        ],
        # "und" (prompts langid was not sure of) is a traffic bucket, not a language drafts are made for.
        "drafts": _draft_rows(registry, offline, [lang["code"] for lang in languages if lang["code"] != UNDETERMINED]),
        "adaptation": adaptation_timeline(registry.adaptation),
        "registry_error": registry.error,
    }


def adaptation_timeline(events: Sequence[Any]) -> list[dict[str, Any]]:
    """`polyspec adapt`'s audit trail, newest first: when, language, step, status, attempt and the figures
    (the same one-line summary as `polyspec adapt history`)."""
    rows = [{"at": e.created_at.isoformat() if e.created_at else None, "language": e.language, "step": e.step,
             "status": e.status, "attempt": e.attempt, "summary": summary(e)[:500]}
            for e in events if e.language != "*"]
    return rows[::-1]
