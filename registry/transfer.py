"""Export the whole registry as JSON and merge such an export back (all or nothing).

Rows are keyed by natural keys (verifier name, draft name@version, deployment name), never by
database ids, so an export moves between SQLite and Postgres registries.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from polyspec.registry.errors import ImportFailed
from polyspec.registry.schema import (
    Deployment, Draft, EngineCalibration, Evaluation, Event, LanguageProfile, LiveStat, Verifier,
)

FORMAT = "polyspec-registry"
FORMAT_VERSION = 1
_VERIFIER_COLS = ("name", "location", "architecture", "vocab_size", "hidden_size", "num_layers", "checksums")
_DRAFT_COLS = ("name", "version", "location", "checksums", "languages", "domain", "draft_vocab_size", "k",
               "provenance", "status")
_EVAL_COLS = ("benchmark", "language", "domain", "k", "acceptance", "mean_acceptance_length", "num_prompts",
              "num_tokens", "method", "subset", "degenerate_share", "details")
_EVAL_DEFAULTS = {"subset": "all", "degenerate_share": None}  # exports written before migration 0002 lack them
_DEPLOY_COLS = ("name", "url", "launch", "languages", "domain", "is_default", "status")
_PROFILE_COLS = ("code", "name", "script", "is_latin", "coverage", "plan", "reason", "prompts_file", "num_prompts")
_PROFILE_LATER = {"draft": None, "acceptance": None, "acceptance_basis": None, "details": {}}  # absent in old exports
_LIVE_COLS = ("router_id", "language", "domain", "draft_name", "requests", "completion_tokens", "num_spec_steps",
              "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos", "generation_s")
_LIVE_DEFAULTS = {"generation_s": 0.0}  # exports written before migration 0003 lack it
_CALIBRATION_COLS = ("deployment", "url", "draft_name", "k", "batch_size", "step_s", "tokens_per_s", "requests",
                     "details")


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _time(value: str | None) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromisoformat(value)


def _ref(d: Draft | None) -> str | None:
    return None if d is None else f"{d.name}@{d.version}"


def _cols(row: Any, cols: tuple[str, ...]) -> dict[str, Any]:
    return {c: getattr(row, c) for c in cols}


def export_all(s: Session) -> dict[str, Any]:
    vnames = {vid: name for vid, name in s.execute(select(Verifier.id, Verifier.name))}
    return {
        "format": FORMAT, "version": FORMAT_VERSION, "exported_at": _iso(dt.datetime.now(dt.timezone.utc)),
        "verifiers": [{**_cols(v, _VERIFIER_COLS), "created_at": _iso(v.created_at)}
                      for v in s.scalars(select(Verifier).order_by(Verifier.id))],
        "drafts": [{**_cols(d, _DRAFT_COLS), "verifier": d.verifier.name, "parent": _ref(d.parent),
                    "created_at": _iso(d.created_at)} for d in s.scalars(select(Draft).order_by(Draft.id))],
        "evaluations": [{**_cols(e, _EVAL_COLS), "draft": _ref(e.draft), "created_at": _iso(e.created_at)}
                        for e in s.scalars(select(Evaluation).order_by(Evaluation.id))],
        "deployments": [{**_cols(d, _DEPLOY_COLS), "draft": _ref(d.draft), "verifier": vnames.get(d.verifier_id),
                         "created_at": _iso(d.created_at)} for d in s.scalars(select(Deployment).order_by(Deployment.id))],
        "language_profiles": [{**_cols(p, (*_PROFILE_COLS, *_PROFILE_LATER)), "verifier": vnames.get(p.verifier_id),
                               "updated_at": _iso(p.updated_at)}
                              for p in s.scalars(select(LanguageProfile).order_by(LanguageProfile.id))],
        "live_stats": [{**_cols(x, _LIVE_COLS), "updated_at": _iso(x.updated_at)}
                       for x in s.scalars(select(LiveStat).order_by(LiveStat.id))],
        "engine_calibrations": [{**_cols(c, _CALIBRATION_COLS), "created_at": _iso(c.created_at)}
                                for c in s.scalars(select(EngineCalibration).order_by(EngineCalibration.id))],
        "events": [{"kind": e.kind, "subject": e.subject, "details": e.details, "created_at": _iso(e.created_at)}
                   for e in s.scalars(select(Event).order_by(Event.id))],
    }


def import_all(s: Session, data: Mapping[str, Any]) -> dict[str, int]:
    """Add rows that are not there yet; identical rows are skipped, conflicting ones abort everything."""
    if data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
        raise ImportFailed(f"not a {FORMAT} v{FORMAT_VERSION} export (format={data.get('format')!r}, "
                           f"version={data.get('version')!r})")
    try:
        return _import(s, data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ImportFailed(f"malformed export: {type(exc).__name__}: {exc}") from exc


def _import(s: Session, data: Mapping[str, Any]) -> dict[str, int]:
    added = dict.fromkeys(("verifiers", "drafts", "evaluations", "deployments", "language_profiles",
                           "live_stats", "engine_calibrations", "events"), 0)
    verifiers = {v.name: v for v in s.scalars(select(Verifier))}
    for item in data.get("verifiers", []):
        have = verifiers.get(item["name"])
        if have is not None:
            if have.location != item["location"]:
                raise ImportFailed(f"verifier {item['name']!r} exists here at {have.location}, export says {item['location']}")
            continue
        verifiers[item["name"]] = row = Verifier(**{c: item[c] for c in _VERIFIER_COLS}, created_at=_time(item.get("created_at")))
        s.add(row)
        added["verifiers"] += 1
    s.flush()
    drafts = {_ref(d): d for d in s.scalars(select(Draft))}
    for item in data.get("drafts", []):
        key = f"{item['name']}@{item['version']}"
        have = drafts.get(key)
        if have is not None:
            if have.checksums != item["checksums"]:
                raise ImportFailed(f"draft {key} exists here with different files (checksums differ)")
            continue
        if item["verifier"] not in verifiers:
            raise ImportFailed(f"draft {key} needs verifier {item['verifier']!r}, which the export lacks")
        parent = drafts.get(item["parent"]) if item.get("parent") else None
        if item.get("parent") and parent is None:
            raise ImportFailed(f"draft {key} needs parent {item['parent']}, which the export lacks")
        drafts[key] = row = Draft(**{c: item[c] for c in _DRAFT_COLS}, verifier=verifiers[item["verifier"]],
                                  parent=parent, created_at=_time(item.get("created_at")))
        s.add(row)
        added["drafts"] += 1
    s.flush()
    added["evaluations"] = _import_evaluations(s, data.get("evaluations", []), drafts)
    added["deployments"] = _import_deployments(s, data.get("deployments", []), drafts, verifiers)
    added["language_profiles"] = _import_profiles(s, data.get("language_profiles", []), verifiers)
    added["live_stats"] = _import_simple(s, LiveStat, data.get("live_stats", []), _LIVE_COLS,
                                         ("router_id", "language", "domain", "draft_name"), "updated_at",
                                         _LIVE_DEFAULTS)
    added["engine_calibrations"] = _import_simple(
        s, EngineCalibration, data.get("engine_calibrations", []), _CALIBRATION_COLS,
        ("deployment", "batch_size", "created_at"), "created_at")
    added["events"] = _import_simple(s, Event, data.get("events", []), ("kind", "subject", "details"),
                                     ("kind", "subject", "created_at"), "created_at")
    return added


def _import_evaluations(s: Session, items: list[dict[str, Any]], drafts: dict[str, Draft]) -> int:
    seen = {(_ref(e.draft), e.benchmark, e.language, e.k, e.method, e.subset or "all", _iso(e.created_at))
            for e in s.scalars(select(Evaluation))}
    n = 0
    for item in items:
        item = {**_EVAL_DEFAULTS, **item}
        key = (item["draft"], item["benchmark"], item["language"], item["k"], item["method"], item["subset"],
               item.get("created_at"))
        if key in seen:
            continue
        if item["draft"] not in drafts:
            raise ImportFailed(f"evaluation of {item['draft']}, which the export lacks")
        s.add(Evaluation(**{c: item[c] for c in _EVAL_COLS}, draft=drafts[item["draft"]],
                         created_at=_time(item.get("created_at"))))
        seen.add(key)
        n += 1
    return n


def _import_deployments(s: Session, items: list[dict[str, Any]], drafts: dict[str, Draft],
                        verifiers: dict[str, Verifier]) -> int:
    have = set(s.scalars(select(Deployment.name)))
    n = 0
    for item in items:
        if item["name"] in have:
            continue
        draft = drafts.get(item["draft"]) if item.get("draft") else None
        if item.get("draft") and draft is None:
            raise ImportFailed(f"deployment {item['name']} uses {item['draft']}, which the export lacks")
        verifier = verifiers.get(item.get("verifier") or "")
        s.add(Deployment(**{c: item[c] for c in _DEPLOY_COLS}, draft=draft,
                         verifier_id=verifier.id if verifier else None, created_at=_time(item.get("created_at"))))
        n += 1
    return n


def _import_profiles(s: Session, items: list[dict[str, Any]], verifiers: dict[str, Verifier]) -> int:
    have = {(p.code, p.verifier_id) for p in s.scalars(select(LanguageProfile))}
    n = 0
    for item in items:
        verifier = verifiers.get(item.get("verifier") or "")
        vid = verifier.id if verifier else None
        if (item["code"], vid) in have:
            continue
        s.add(LanguageProfile(**{c: item[c] for c in _PROFILE_COLS},
                              **{c: item.get(c, default) for c, default in _PROFILE_LATER.items()}, verifier_id=vid,
                              updated_at=_time(item.get("updated_at"))))
        have.add((item["code"], vid))
        n += 1
    return n


def _import_simple(s: Session, model: type, items: list[dict[str, Any]], cols: tuple[str, ...],
                   key_cols: tuple[str, ...], time_col: str, defaults: Mapping[str, Any] | None = None) -> int:
    def key_of(get: Any) -> tuple[Any, ...]:
        return tuple(_iso(get(c)) if c == time_col and not isinstance(get(c), str) else get(c) for c in key_cols)

    have = {key_of(lambda c, r=r: getattr(r, c)) for r in s.scalars(select(model))}
    n = 0
    for item in items:
        item = {**(defaults or {}), **item}
        key = key_of(item.get)
        if key in have:
            continue
        s.add(model(**{c: item[c] for c in cols}, **{time_col: _time(item.get(time_col))}))
        have.add(key)
        n += 1
    return n
