"""Deployments (what the router serves) and live statistics (what the routers measured)."""

from __future__ import annotations

from polyspec.core.settings import get_settings

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from polyspec.registry import calibrations
from polyspec.registry.errors import AlreadyExists, NotFound, RegistryError
from polyspec.registry.languages import normalize_languages
from polyspec.registry.records import DeploymentView, LiveStatRecord
from polyspec.registry.schema import Deployment, Draft, Evaluation, Event, LiveStat, Verifier

# Evaluations measured before deployment; "live" ones come from the routers and are kept apart.
OFFLINE_METHODS = ("offline", "vllm")
_COUNTERS = ("requests", "completion_tokens", "num_spec_steps", "num_draft_tokens", "num_accepted_tokens")


def ensure_not_deployed(session: Session, draft: Draft) -> None:
    names = [d.name for d in draft.deployments if d.status == "active"]
    if names:
        raise RegistryError(
            f"{draft.name}@{draft.version} is used by active deployment(s) {', '.join(names)}; undeploy them first")


def deploy(
    session: Session, draft: Draft | None, *, name: str, url: str | None = None, launch: Mapping[str, Any] | None = None,
    languages: list[str] | str | None = None, domain: str = "general", default: bool = False,
    verifier: str | None = None,
) -> DeploymentView:
    """Create (or re-activate a stopped) deployment. ``draft=None`` serves the verifier without speculation."""
    if not name or not name.strip():
        raise RegistryError("a deployment needs a name")
    if url is not None and not url.startswith(("http://", "https://")):
        raise RegistryError(f"engine URL must start with http:// or https://, not {url!r}")
    if url is not None and not calibrations.url_host(url):
        raise RegistryError(f"engine URL names no host: {url!r}")
    if draft is not None and draft.status == "retired":
        raise RegistryError(f"{draft.name}@{draft.version} is retired; promote a draft before deploying it")
    verifier_row = draft.verifier if draft is not None else _deploy_verifier(session, verifier)
    if draft is not None and verifier is not None and verifier != verifier_row.name:
        raise RegistryError(f"{draft.name}@{draft.version} belongs to verifier {verifier_row.name}, not {verifier}")
    k = (launch or {}).get("k")
    if k is not None and k != "auto" and not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 16):
        raise RegistryError(f"launch k must be an integer from 1 to 16, or \"auto\", not {k!r}")
    langs = normalize_languages(languages) if languages else []
    if draft is None and not langs and not default:
        raise RegistryError("a deployment without a draft needs --languages or --default")
    row = session.scalars(select(Deployment).where(Deployment.name == name)).first()
    if row is not None and row.status == "active":
        raise AlreadyExists(f"deployment {name!r} already exists; undeploy it first")
    if row is None:
        row = Deployment(name=name)
        session.add(row)
    row.draft, row.verifier_id, row.url = draft, verifier_row.id, url
    row.launch, row.languages, row.domain = dict(launch or {}), langs, domain
    row.status, row.is_default = "active", int(default)
    if default:
        for other in session.scalars(select(Deployment).where(Deployment.name != name, Deployment.is_default == 1)):
            other.is_default = 0
    session.flush()
    session.add(Event(kind="deploy", subject=name, details={"draft": _ref(draft), "url": url}))
    return _view(session, row)


def _deploy_verifier(session: Session, name: str | None) -> Verifier:
    if name is None:
        name = get_settings().default_verifier
    row = session.scalars(select(Verifier).where(Verifier.name == name)).first()
    if row is None:
        raise NotFound(f"no verifier {name!r} in the registry (add it with `polyspec registry add-verifier`)")
    return row


def undeploy(session: Session, name: str) -> DeploymentView:
    row = session.scalars(select(Deployment).where(Deployment.name == name)).first()
    if row is None or row.status != "active":
        raise NotFound(f"no active deployment named {name!r}")
    row.status, row.is_default = "stopped", 0
    session.add(Event(kind="undeploy", subject=name, details={"draft": _ref(row.draft)}))
    session.flush()
    return _view(session, row)


def views(session: Session, *, include_stopped: bool = False) -> list[DeploymentView]:
    query = select(Deployment).order_by(Deployment.name)
    if not include_stopped:
        query = query.where(Deployment.status == "active")
    return [_view(session, row) for row in session.scalars(query)]


def _ref(draft: Draft | None) -> str | None:
    return None if draft is None else f"{draft.name}@{draft.version}"


def _view(session: Session, row: Deployment) -> DeploymentView:
    draft = row.draft
    verifier = draft.verifier if draft is not None else session.get(Verifier, row.verifier_id) if row.verifier_id else None
    languages = list(row.languages or []) or (list(draft.languages) if draft is not None else [])
    k = calibrations.served_k(row) if draft is not None else None
    acceptance, samples = _offline_acceptance(session, draft)
    return DeploymentView(
        name=row.name, url=row.url, launch=dict(row.launch or {}), status=row.status, draft=_ref(draft),
        draft_name=draft.name if draft else None, draft_version=draft.version if draft else None,
        draft_location=draft.location if draft else None, k=k,
        verifier_name=verifier.name if verifier else None, verifier_location=verifier.location if verifier else None,
        languages=languages, domain=row.domain, is_default=bool(row.is_default),
        offline_mal=_best_mal(session, draft), offline_acceptance=acceptance, offline_samples=samples,
        step_s=calibrations.step_costs(session, row.name, _ref(draft) or "none", k or 0),
        step_shape=calibrations.engine_shape(row, k or 0), created_at=row.created_at,
    )


def _offline_acceptance(session: Session, draft: Draft | None) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Per language, the evaluation the speed model reads before live counters exist (``_preference``): a vLLM
    engine's own counts over all its answers where the draft has one for the language, else the teacher-forced
    figure over the non-degenerate answers, else over all answers; among equals, the one with the most prompts
    (the newest on a tie). A vLLM evaluation at the served answer length counts what the router will count.
    Teacher-forced answers run long and most end in repetition loops, which any draft predicts well; served
    answers loop far less, so the all-answer figure ran 8-32 % above the tokens per step a CPU fleet measured,
    the non-degenerate one up to 13 % (docs/speed.md, "Acceptance"). Live counters take over from any of them
    as traffic comes."""
    if draft is None:
        return {}, {}
    chosen: dict[str, Evaluation] = {}
    query = select(Evaluation).where(Evaluation.draft_id == draft.id, Evaluation.method.in_(OFFLINE_METHODS),
                                     Evaluation.subset.in_(("all", "non_degenerate")), Evaluation.domain == "general")
    for ev in session.scalars(query.order_by(Evaluation.id)):
        have = chosen.get(ev.language)
        if have is None or _preference(ev) >= _preference(have):
            chosen[ev.language] = ev
    return ({lang: list(ev.acceptance or []) for lang, ev in sorted(chosen.items())},
            {lang: int(ev.num_prompts or 0) for lang, ev in sorted(chosen.items())})


def _preference(ev: Evaluation) -> tuple[bool, bool, int]:
    """How much the speed model trusts an evaluation: measured by a vLLM engine (over all its answers, as the
    router counts them) before teacher-forced; then the non-degenerate subset of a teacher-forced one; then the
    number of prompts."""
    served = ev.method == "vllm"
    return served, ev.subset == ("all" if served else "non_degenerate"), ev.num_prompts or 0


def _best_mal(session: Session, draft: Draft | None) -> dict[str, float]:
    if draft is None:
        return {}
    best: dict[str, float] = {}
    query = select(Evaluation).where(Evaluation.draft_id == draft.id, Evaluation.method.in_(OFFLINE_METHODS))
    for ev in session.scalars(query):
        best[ev.language] = max(best.get(ev.language, 0.0), ev.mean_acceptance_length)
    return dict(sorted(best.items()))


def _field(row: Any, name: str, default: Any = None) -> Any:
    return row.get(name, default) if isinstance(row, Mapping) else getattr(row, name, default)


def record_live_stats(session: Session, router_id: str, rows: Iterable[Any]) -> None:
    """Add each row's counters to the stored aggregate of (router_id, language, domain, draft_name).

    Several writers may share a row (routers left with one router_id, the hostname, on one host): each row
    is read ``FOR UPDATE`` so concurrent additions on Postgres serialise instead of overwriting one another,
    keys are visited in one order so two flushes never deadlock, and a first insert that loses the race to
    another writer's becomes an update of that row.
    """
    items = sorted(((_live_key(router_id, item), item) for item in rows), key=lambda pair: sorted(pair[0].items()))
    for key, item in items:
        stat = _live_row(session, key)
        for counter in _COUNTERS:
            value = int(_field(item, counter, 0) or 0)
            if value < 0:
                raise RegistryError(f"live stat {counter} must not be negative ({value})")
            setattr(stat, counter, (getattr(stat, counter) or 0) + value)
        stat.accepted_per_pos = add_lists(stat.accepted_per_pos or [], list(_field(item, "accepted_per_pos", []) or []))
        seconds = float(_field(item, "generation_s", 0.0) or 0.0)
        if not 0.0 <= seconds < 1e12:  # also refuses NaN
            raise RegistryError(f"live stat generation_s must be a non-negative number of seconds ({seconds})")
        stat.generation_s = (stat.generation_s or 0.0) + seconds
        session.flush()


def _live_key(router_id: str, item: Any) -> dict[str, str]:
    return {"router_id": router_id, "language": str(_field(item, "language")),
            "domain": str(_field(item, "domain") or "general"),
            "draft_name": str(_field(item, "draft_name", None) or _field(item, "draft", None) or "none")}


def _live_row(session: Session, key: dict[str, str]) -> LiveStat:
    """The stored aggregate of ``key``, locked for this transaction; created (zero) when there is none."""
    query = select(LiveStat).filter_by(**key).with_for_update()
    stat = session.scalars(query).first()
    if stat is not None:
        return stat
    try:
        with session.begin_nested():  # a savepoint: a lost insert race must not abort the whole flush
            stat = LiveStat(**key, accepted_per_pos=[], generation_s=0.0, **{c: 0 for c in _COUNTERS})
            session.add(stat)
            session.flush()
        return stat
    except IntegrityError:  # another writer inserted it meanwhile (Postgres): add to theirs
        return session.scalars(query).one()


def add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [int(a[i] if i < len(a) else 0) + int(b[i] if i < len(b) else 0) for i in range(n)]


def live_stats(session: Session, *, router_id: str | None = None) -> list[LiveStatRecord]:
    """Aggregates per (language, domain, draft), summed across routers unless ``router_id`` is given."""
    query = select(LiveStat)
    if router_id is not None:
        query = query.where(LiveStat.router_id == router_id)
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for stat in session.scalars(query):
        key = (stat.language, stat.domain, stat.draft_name)
        acc = merged.setdefault(key, {"accepted_per_pos": [], "generation_s": 0.0, **{c: 0 for c in _COUNTERS}})
        for counter in _COUNTERS:
            acc[counter] += getattr(stat, counter) or 0
        acc["generation_s"] += stat.generation_s or 0.0
        acc["accepted_per_pos"] = add_lists(acc["accepted_per_pos"], list(stat.accepted_per_pos or []))
    return [
        LiveStatRecord(router_id=router_id or "*", language=k[0], domain=k[1], draft_name=k[2], **v)
        for k, v in sorted(merged.items())
    ]
