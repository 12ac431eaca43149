"""When `polyspec adapt` acts, and why: the triggers, read from the registry and the capture directory.

A language (or a domain of it) triggers an adaptation when, over the window (``window_s``, measured
between stored traffic snapshots; the first cycle sees everything since the registry began):

- **slow**: its observed tokens/s is below target: ``target_tps[lang]`` when set, else ``target_speedup``
  times the speculation-free tokens/s (live traffic served without a draft, else the speed model's
  prediction from `polyspec deploy plan`). With no speed figure at all, its live mean acceptance length
  must reach ``target_mal`` instead;
- **no-draft**: at least ``min_requests`` requests and ``min_share`` of the traffic, and no deployment
  with a draft serves it (an open ``train-draft`` recommendation of `polyspec deploy plan` counts too);
- **new-prompts**: at least ``min_new_prompts`` prompts captured since its last training.

A triggered language is trained when it has ``min_train_prompts`` captured prompts and is not in its
cooldown; an interrupted training is resumed first. One language acts per cycle (the busiest); the others
wait for the next one.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from polyspec.adapt.settings import AdaptSettings
from polyspec.core.languages import UNDETERMINED
from polyspec.training.traffic import capture_files, count_new, read_captured

NOT_LANGUAGES = (UNDETERMINED, "other", "*")
ALL_DOMAINS = "*"
_FIELDS = ("r", "t", "s", "n", "a", "pr", "pt", "ps")  # requests, tokens, seconds, steps, accepted, plain ...
ACTIVE_STEPS = ("trigger", "training", "gate", "canary", "swap", "rollback", "failed")


def counters_of(stats: list[Any]) -> dict[str, dict[str, float]]:
    """Cumulative live counters per "language|domain" and "language|*" (plain: served without a draft)."""
    out: dict[str, dict[str, float]] = {}
    for row in stats:
        if row.language in NOT_LANGUAGES:
            continue
        plain = row.draft_name == "none"
        for key in (f"{row.language}|{row.domain}", f"{row.language}|{ALL_DOMAINS}"):
            acc = out.setdefault(key, dict.fromkeys(_FIELDS, 0.0))
            acc["r"] += row.requests
            acc["t"] += row.completion_tokens
            acc["s"] += row.generation_s
            acc["n"] += row.num_spec_steps
            acc["a"] += row.num_accepted_tokens
            if plain:
                acc["pr"] += row.requests
                acc["pt"] += row.completion_tokens
                acc["ps"] += row.generation_s
    return out


def window_delta(now: dict[str, dict[str, float]], before: dict[str, dict[str, float]] | None) -> dict[str, dict[str, float]]:
    """``now - before`` per key; a key whose counters went down (a registry restored or reset) counts from zero."""
    before = before or {}
    out = {}
    for key, acc in now.items():
        old = before.get(key) or {}
        delta = {f: acc.get(f, 0.0) - float(old.get(f, 0.0)) for f in _FIELDS}
        out[key] = dict(acc) if any(v < 0 for v in delta.values()) else delta
    return out


@dataclass
class Trigger:
    kind: str  # slow | no-draft | new-prompts | recommendation
    domain: str
    why: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Action:
    language: str
    domain: str
    decision: str  # train | resume | wait
    why: str
    triggers: list[Trigger] = field(default_factory=list)
    requests: int = 0
    captured: int = 0
    new_prompts: int = 0
    chosen: bool = False  # the one this cycle acts on
    resume: dict[str, Any] | None = None  # the interrupted training's event details


@dataclass
class Assessment:
    at: float
    window_since: float | None
    observed: dict[str, dict[str, Any]]
    actions: list[Action]

    @property
    def chosen(self) -> Action | None:
        return next((a for a in self.actions if a.chosen), None)

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "window_since": self.window_since, "observed": self.observed,
                "actions": [asdict(a) for a in self.actions]}


def figures(acc: dict[str, float]) -> dict[str, Any]:
    plain_tps = acc["pt"] / acc["ps"] if acc["ps"] > 0 and acc["pr"] > 0 else None
    return {"requests": int(acc["r"]), "tokens_per_s": round(acc["t"] / acc["s"], 3) if acc["s"] > 0 else None,
            "mal": round(1 + acc["a"] / acc["n"], 4) if acc["n"] > 0 else (1.0 if acc["r"] > 0 else None),
            "plain_tokens_per_s": round(plain_tps, 3) if plain_tps else None}


def _slow(lang: str, domain: str, fig: dict[str, Any], plan_plain: float | None, s: AdaptSettings) -> Trigger | None:
    """The slow trigger of one (language, domain) with enough requests, or None when it meets its target."""
    target = s.target_tps.get(lang)
    plain = fig["plain_tokens_per_s"] or plan_plain
    basis = "configured" if target else "speculation-free"
    if target is None and plain:
        target = round(s.target_speedup * plain, 3)
    tps, where = fig["tokens_per_s"], f"{lang}/{domain}"
    if target is not None and tps is not None:
        if tps >= target:
            return None
        why = (f"{where}: observed {tps:.1f} tokens/s over {fig['requests']} requests, below its target {target:.1f} "
               f"({'set in target_tps' if basis == 'configured' else f'{s.target_speedup:g} x {plain:.1f} {basis}'})")
        return Trigger("slow", domain, why, {**fig, "target_tokens_per_s": target, "basis": basis})
    mal = fig["mal"]
    if mal is None or mal >= s.target_mal:
        return None
    why = (f"{where}: live mean acceptance length {mal:.2f} over {fig['requests']} requests, below {s.target_mal:g} "
           "(no speed figures yet: judged on acceptance)")
    return Trigger("slow", domain, why, {**fig, "target_mal": s.target_mal, "basis": "mal"})


def language_triggers(lang: str, window: dict[str, dict[str, float]], total: int, served_by_draft: bool,
                      recommended: dict[str, Any] | None, new_prompts: int, plan_plain: float | None,
                      s: AdaptSettings) -> list[Trigger]:
    out: list[Trigger] = []
    whole = figures(window.get(f"{lang}|{ALL_DOMAINS}") or dict.fromkeys(_FIELDS, 0.0))
    if whole["requests"] >= s.min_requests:
        slow = _slow(lang, "general", whole, plan_plain, s)
        out += [slow] if slow else []
    for key, acc in sorted(window.items()):
        name, _, domain = key.partition("|")
        if name == lang and domain not in (ALL_DOMAINS, "general") and acc["r"] >= s.min_requests:
            slow = _slow(lang, domain, figures(acc), plan_plain, s)
            out += [slow] if slow else []
    share = whole["requests"] / total if total else 0.0
    if not served_by_draft and whole["requests"] >= s.min_requests and share >= s.min_share:
        out.append(Trigger("no-draft", "general", f"{lang}: {whole['requests']} requests ({share:.0%} of the traffic) "
                           "and no deployment with a draft serves it", {"requests": whole["requests"], "share": share}))
    if recommended is not None:
        out.append(Trigger("recommendation", "general", f"{lang}: `polyspec deploy plan` recommends a draft "
                           f"({recommended.get('why', 'train-draft')})", dict(recommended)))
    if new_prompts >= s.min_new_prompts:
        out.append(Trigger("new-prompts", "general", f"{lang}: {new_prompts} prompts captured since its last draft "
                           f"(>= {s.min_new_prompts})", {"new_prompts": new_prompts}))
    return out


def assess(reg: Any, s: AdaptSettings, *, now: float | None = None) -> Assessment:
    """Everything the triggers see now, and the action per language. Reads only: the dry run is this."""
    now = time.time() if now is None else now
    capture = s.resolved_capture_dir()
    current = counters_of(reg.live_stats())
    snapshot = reg.traffic_observation(now - s.window_s)
    window = window_delta(current, (snapshot or {}).get("counters"))
    deployments = reg.active_deployments()
    served = {lang for d in deployments if d.draft for lang in d.languages}
    recs = {r["subject"]: r["details"] for r in reg.recommendations("train-draft")}
    plan_plain = {lp.language: lp.plain_tps for lp in reg.plan(record=False).languages} if deployments else {}
    unfinished = {e.language for e in reg.adaptation_events(steps=["training"], limit=200)
                  if e.status in ("started", "interrupted")}
    langs = {k.partition("|")[0] for k in window} | set(recs) | _captured_languages(capture) | unfinished
    langs = {lang for lang in langs if lang not in NOT_LANGUAGES and (not s.languages or lang in s.languages)}
    total = int(sum(acc["r"] for k, acc in window.items() if k.endswith(f"|{ALL_DOMAINS}")))
    actions = []
    for lang in sorted(langs):
        last_training = reg.last_adaptation(lang, "training")
        marks = _last_marks(reg, lang)
        new = count_new(capture, lang, marks)
        triggers = language_triggers(lang, window, total, lang in served, recs.get(lang), new, plan_plain.get(lang), s)
        requests = int((window.get(f"{lang}|{ALL_DOMAINS}") or {}).get("r", 0))
        started = reg.last_adaptation(lang, "training", status="started") if last_training is not None else None
        if last_training is not None and last_training.status in ("started", "interrupted") and started is not None \
                and started.attempt == last_training.attempt:
            actions.append(Action(lang, started.details.get("domain", "general"), "resume",
                                  f"training attempt {last_training.attempt} was {last_training.status}: resume it",
                                  triggers, requests, 0, new, resume=started.details))
            continue
        if not triggers:
            continue
        domain = _domain(triggers)
        captured = len(read_captured(capture, lang, domain)[0])
        actions.append(_decide(reg, lang, domain, triggers, requests, captured, new, now, s))
    actions.sort(key=lambda a: (a.decision != "resume", a.decision != "train", -a.requests, a.language))
    if actions and actions[0].decision in ("train", "resume"):
        actions[0].chosen = True
    observed = {k: figures(acc) for k, acc in sorted(window.items())}
    return Assessment(now, (snapshot or {}).get("at"), observed, actions)


def _decide(reg: Any, lang: str, domain: str, triggers: list[Trigger], requests: int, captured: int, new: int,
            now: float, s: AdaptSettings) -> Action:
    recent = [e for e in reg.adaptation_events(lang, steps=list(ACTIVE_STEPS), limit=20)
              if now - float(e.details.get("at", 0.0)) < s.cooldown_s]
    if recent:
        until = float(recent[-1].details.get("at", now)) + s.cooldown_s
        why = (f"cooldown: last attempt {recent[-1].attempt or '?'} ({recent[-1].step}, {recent[-1].status}) ends "
               f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(until))}")
        return Action(lang, domain, "wait", why, triggers, requests, captured, new)
    if captured < s.min_train_prompts:
        return Action(lang, domain, "wait", f"only {captured} usable captured prompts; a training needs "
                      f"{s.min_train_prompts} (turn capture on: POLYSPEC_ROUTER_CAPTURE=1)", triggers, requests,
                      captured, new)
    return Action(lang, domain, "train", "; ".join(t.why for t in triggers), triggers, requests, captured, new)


def _domain(triggers: list[Trigger]) -> str:
    """Language-wide when any trigger is; else the domain that triggered."""
    domains = [t.domain for t in triggers]
    return "general" if "general" in domains else domains[0]


def _last_marks(reg: Any, lang: str) -> dict[str, Any]:
    """Capture watermarks of the language's last training that produced a candidate."""
    event = reg.last_adaptation(lang, "training", status="done")
    return dict((event.details.get("dataset") or {}).get("marks") or {}) if event else {}


def _captured_languages(capture: Any) -> set[str]:
    if not capture.is_dir():
        return set()
    names = {p.name.split("-")[0].removesuffix(".jsonl") for p in capture.glob("*.jsonl")}
    return {n for n in names if capture_files(capture, n)}
