"""The registry: verifiers, drafts and evaluations (this file); deployments, live stats, promotion,
language profiles and JSON transfer live in sibling modules and are exposed as methods here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from polyspec.core.acceptance import MAL_TOLERANCE, mal_from_positions
from polyspec.registry import (
    adaptation, artifacts, calibrations, db, deployments, locks, planning, profiles, promotion, transfer,
)
from polyspec.registry.errors import AlreadyExists, InvalidDraft, InvalidEvaluation, NotFound, RegistryError, RegistryMissing
from polyspec.registry.languages import normalize_languages
from polyspec.registry.records import (
    AdaptEventRecord, CalibrationRecord, DeploymentView, DraftRecord, EvaluationRecord, EventRecord, LanguageProfileRecord, LiveStatRecord,
    PromotionResult, VerifierRecord,
)
from polyspec.registry.schema import Draft, Evaluation, Event, Verifier

DRAFT_STATUSES = ("candidate", "active", "retired")
EVAL_METHODS = ("offline", "vllm", "live")
EVAL_SUBSETS = ("all", "non_degenerate")
DraftRef = str | DraftRecord


def open_registry(url: str | None = None, *, create: bool = True) -> Registry:
    """Open (and migrate to head) the registry at ``url``; default: settings' registry URL.

    ``create=False`` is for readers that must never make a registry appear (the router, the dashboard):
    a SQLite file that does not exist, or a database without the registry's tables, raises
    `RegistryMissing` instead of becoming an empty registry.
    """
    if url is None:
        from polyspec.core.settings import get_settings

        url = get_settings().resolved_registry_url
    engine = db.make_engine(url, create=create)
    try:
        if not create:
            with engine.connect() as conn:
                if db.current_revision(conn) is None:
                    shown = make_url(url).render_as_string(hide_password=True)
                    raise RegistryMissing(f"{shown} holds no polyspec registry; {db.MISSING_HINT}")
        db.upgrade(engine)
    except RegistryError:
        engine.dispose()
        raise
    except Exception as exc:  # noqa: BLE001 - connection/driver errors: one clear line
        engine.dispose()
        raise RegistryError(f"cannot open registry {engine.url!r}: {type(exc).__name__}: {exc}") from exc
    return Registry(engine)


def parse_ref(ref: DraftRef) -> tuple[str, int | None]:
    """"name@3" -> ("name", 3); "name" -> ("name", None) meaning the newest version."""
    if isinstance(ref, DraftRecord):
        return ref.name, ref.version
    name, sep, version = ref.strip().rpartition("@")
    if not sep:
        return ref.strip(), None
    if not version.isdigit():
        raise NotFound(f"bad draft reference {ref!r}: expected NAME or NAME@VERSION")
    return name, int(version)


def draft_row(session: Session, ref: DraftRef) -> Draft:
    name, version = parse_ref(ref)
    query = select(Draft).where(Draft.name == name)
    query = query.where(Draft.version == version) if version is not None else query.order_by(Draft.version.desc())
    row = session.scalars(query.limit(1)).first()
    if row is None:
        raise NotFound(f"no draft {name}" + (f"@{version}" if version is not None else "") + " in the registry")
    return row


def verifier_row(session: Session, name: str) -> Verifier:
    row = session.scalars(select(Verifier).where(Verifier.name == name)).first()
    if row is None:
        known = session.scalars(select(Verifier.name)).all()
        hint = f" (known: {', '.join(known)})" if known else " (add one with `polyspec registry add-verifier`)"
        raise NotFound(f"no verifier {name!r} in the registry{hint}")
    return row


def record_event(session: Session, kind: str, subject: str, **details: Any) -> None:
    session.add(Event(kind=kind, subject=subject, details=details))


class Registry:
    """Transactional access to the registry. Every method returns plain records, never ORM rows."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._writer = db.write_engine(engine)

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def session(self, write: bool = False) -> Iterator[Session]:
        """One transaction: committed on success, rolled back (nothing written) on any error."""
        with Session(self._writer if write else self.engine, expire_on_commit=False) as session:
            with session.begin():
                yield session

    # -- verifiers ---------------------------------------------------------------------------
    def add_verifier(self, spec: Any, *, name: str | None = None) -> VerifierRecord:
        """Register a verifier from a spec (alias, local dir, hub id) or a ``VerifierInfo``."""
        info = artifacts.resolve_verifier(spec) if isinstance(spec, str) else spec
        name = name or info.name
        location = str(info.path)
        with self.session(write=True) as s:
            existing = s.scalars(select(Verifier).where(Verifier.name == name)).first()
            if existing is not None:
                if existing.location != location:
                    raise AlreadyExists(f"verifier {name!r} is already registered at {existing.location}")
                return VerifierRecord.of(existing)
            row = Verifier(
                name=name, location=location, architecture=info.architecture, vocab_size=int(info.vocab_size),
                hidden_size=int(info.hidden_size), num_layers=int(info.num_layers),
                checksums=dict(getattr(info, "checksums", None) or {}),
            )
            s.add(row)
            s.flush()
            return VerifierRecord.of(row)

    def ensure_verifier(self, spec: str | None = None) -> VerifierRecord:
        """The registered verifier named ``spec`` (default: settings' verifier), added on first use."""
        if spec is None:
            from polyspec.core.settings import get_settings

            spec = get_settings().default_verifier
        with self.session() as s:
            row = s.scalars(select(Verifier).where(Verifier.name == spec)).first()
            if row is not None:
                return VerifierRecord.of(row)
        return self.add_verifier(spec)

    def get_verifier(self, name: str) -> VerifierRecord:
        with self.session() as s:
            return VerifierRecord.of(verifier_row(s, name))

    def verifiers(self) -> list[VerifierRecord]:
        with self.session() as s:
            return [VerifierRecord.of(r) for r in s.scalars(select(Verifier).order_by(Verifier.name))]

    # -- drafts ------------------------------------------------------------------------------
    def import_draft(
        self, path: str | Path, *, verifier: str, name: str, languages: list[str] | str, domain: str = "general",
        k: int = 3, parent: DraftRef | None = None, provenance: Mapping[str, Any] | None = None,
        status: str = "candidate",
    ) -> DraftRecord:
        """Validate a speculators Eagle3 draft against its verifier, checksum it and record it.

        Refused (nothing written) when the checkpoint is not a valid draft for that verifier.
        """
        if status not in DRAFT_STATUSES:
            raise RegistryError(f"status must be one of {', '.join(DRAFT_STATUSES)}, not {status!r}")
        if not name or "@" in name:
            raise RegistryError(f"bad draft name {name!r}: non-empty, without '@'")
        if k < 1:
            raise RegistryError(f"k must be >= 1, not {k}")
        langs = normalize_languages(languages)
        if not langs:
            raise RegistryError("a draft needs at least one language")
        location = str(path)
        with self.session() as s:
            vrow = verifier_row(s, verifier)  # stays readable after the session: expire_on_commit=False
        local = artifacts.materialize(location)
        info = artifacts.inspect_draft(local, vrow)
        sums = artifacts.checksums(local)
        if not sums:
            raise InvalidDraft(f"{local}: empty directory")
        if not artifacts.is_hub_id(location):
            location = str(local)
        with self.session(write=True) as s:
            vrow = verifier_row(s, verifier)
            parent_row = draft_row(s, parent) if parent is not None else None
            latest = s.scalar(select(func.max(Draft.version)).where(Draft.name == name)) or 0
            row = Draft(
                name=name, version=latest + 1, location=location, checksums=sums, verifier=vrow, languages=langs,
                domain=domain, draft_vocab_size=int(info.draft_vocab_size), k=int(k), parent=parent_row,
                provenance=dict(provenance or {}), status=status,
            )
            s.add(row)
            s.flush()
            return DraftRecord.of(row)

    def get_draft(self, ref: DraftRef) -> DraftRecord:
        with self.session() as s:
            return DraftRecord.of(draft_row(s, ref))

    def drafts(
        self, *, verifier: str | None = None, language: str | None = None, status: str | None = None,
        domain: str | None = None,
    ) -> list[DraftRecord]:
        with self.session() as s:
            query = select(Draft).order_by(Draft.name, Draft.version)
            if verifier is not None:
                query = query.where(Draft.verifier_id == verifier_row(s, verifier).id)
            if status is not None:
                query = query.where(Draft.status == status)
            if domain is not None:
                query = query.where(Draft.domain == domain)
            rows = [DraftRecord.of(r) for r in s.scalars(query)]
        if language is not None:
            lang = normalize_languages([language])[0]
            rows = [r for r in rows if lang in r.languages]
        return rows

    def retire(self, ref: DraftRef) -> DraftRecord:
        """Mark a draft retired. Refused while an active deployment still uses it."""
        with self.session(write=True) as s:
            row = draft_row(s, ref)
            deployments.ensure_not_deployed(s, row)
            row.status = "retired"
            record_event(s, "retire", f"{row.name}@{row.version}")
            return DraftRecord.of(row)

    def verify_draft(self, ref: DraftRef | None = None) -> dict[str, list[str]]:
        """Re-check sha256 of every file of one draft (or all drafts): ref -> problems (empty = intact)."""
        with self.session() as s:
            rows = [draft_row(s, ref)] if ref is not None else list(s.scalars(select(Draft).order_by(Draft.id)))
            targets = [(f"{r.name}@{r.version}", r.location, dict(r.checksums or {})) for r in rows]
        report: dict[str, list[str]] = {}
        for key, location, expected in targets:
            try:
                local = artifacts.materialize(location)
            except InvalidDraft as exc:
                report[key] = [str(exc)]
                continue
            report[key] = artifacts.verify_checksums(local, expected)
        return report

    # -- evaluations -------------------------------------------------------------------------
    def add_evaluation(
        self, draft: DraftRef, *, benchmark: str, language: str, k: int, acceptance: list[float],
        mean_acceptance_length: float | None = None, num_prompts: int = 0, num_tokens: int = 0,
        method: str = "offline", domain: str = "general", details: Mapping[str, Any] | None = None,
        subset: str = "all", degenerate_share: float | None = None,
    ) -> EvaluationRecord:
        """Record a measured acceptance curve. acceptance[i] = P(at least i+1 drafts accepted); ``subset`` says
        which answers it covers ("all" or "non_degenerate"), ``degenerate_share`` the share of loops among them."""
        acc = _check_acceptance(acceptance, k, method)
        if subset not in EVAL_SUBSETS:
            raise InvalidEvaluation(f"subset must be one of {', '.join(EVAL_SUBSETS)}, not {subset!r}")
        if degenerate_share is not None and not 0.0 <= degenerate_share <= 1.0:
            raise InvalidEvaluation(f"degenerate_share must lie in [0, 1]: {degenerate_share}")
        mal = mal_from_positions(acc)
        if mean_acceptance_length is not None and abs(mean_acceptance_length - mal) > MAL_TOLERANCE:
            raise InvalidEvaluation(
                f"mean acceptance length {mean_acceptance_length:.4f} disagrees with 1 + sum(acceptance) = {mal:.4f}")
        lang = normalize_languages([language])[0]
        with self.session(write=True) as s:
            row = Evaluation(
                draft=draft_row(s, draft), benchmark=benchmark, language=lang, domain=domain, k=k, acceptance=acc,
                mean_acceptance_length=mal, num_prompts=int(num_prompts), num_tokens=int(num_tokens),
                method=method, subset=subset, degenerate_share=degenerate_share, details=dict(details or {}),
            )
            s.add(row)
            s.flush()
            return EvaluationRecord.of(row)

    def evaluations(
        self, draft: DraftRef | None = None, *, language: str | None = None, benchmark: str | None = None,
        method: str | None = None, subset: str | None = None,
    ) -> list[EvaluationRecord]:
        with self.session() as s:
            query = select(Evaluation).order_by(Evaluation.id)
            if draft is not None:
                query = query.where(Evaluation.draft_id == draft_row(s, draft).id)
            if language is not None:
                query = query.where(Evaluation.language == normalize_languages([language])[0])
            if benchmark is not None:
                query = query.where(Evaluation.benchmark == benchmark)
            if method is not None:
                query = query.where(Evaluation.method == method)
            if subset is not None:
                query = query.where(Evaluation.subset == subset)
            return [EvaluationRecord.of(r) for r in s.scalars(query)]

    def best_evaluations(self, draft: DraftRef | None = None, **filters: Any) -> list[EvaluationRecord]:
        """The best (highest mean acceptance length) evaluation per (draft, language)."""
        best: dict[tuple[str, str], EvaluationRecord] = {}
        for ev in self.evaluations(draft, **filters):
            key = (ev.draft, ev.language)
            if key not in best or ev.mean_acceptance_length > best[key].mean_acceptance_length:
                best[key] = ev
        return sorted(best.values(), key=lambda e: e.draft + "|" + e.language)

    # -- delegated areas ---------------------------------------------------------------------
    def promote(self, draft: DraftRef, **options: Any) -> PromotionResult:
        """Promotion gate; see ``registry.promotion.promote`` for the options."""
        with self.session(write=True) as s:
            return promotion.promote(s, draft_row(s, draft), **options)

    def deploy(self, draft: DraftRef | None, *, name: str, **options: Any) -> DeploymentView:
        with self.session(write=True) as s:
            row = draft_row(s, draft) if draft is not None else None
            return deployments.deploy(s, row, name=name, **options)

    def undeploy(self, name: str) -> DeploymentView:
        with self.session(write=True) as s:
            return deployments.undeploy(s, name)

    def deployments(self, *, include_stopped: bool = False) -> list[DeploymentView]:
        with self.session() as s:
            return deployments.views(s, include_stopped=include_stopped)

    def active_deployments(self) -> list[DeploymentView]:
        return self.deployments()

    def record_live_stats(self, router_id: str, rows: list[Any]) -> None:
        with self.session(write=True) as s:
            deployments.record_live_stats(s, router_id, rows)

    def live_stats(self, *, router_id: str | None = None) -> list[LiveStatRecord]:
        with self.session() as s:
            return deployments.live_stats(s, router_id=router_id)

    def record_calibration(self, deployment: str, points: list[Mapping[str, Any]], *, who: str = "calibrate") -> int:
        """Store one calibration run of a deployment (registry.calibrations); returns the points stored."""
        with self.session(write=True) as s:
            return calibrations.record(s, deployment, points, who=who)

    def calibrations(self, deployment: str | None = None) -> list[CalibrationRecord]:
        """The newest point per (deployment, batch size)."""
        with self.session() as s:
            return calibrations.latest(s, deployment)

    def plan(self, *, min_share: float = 0.05, min_speedup: float = 1.10, min_k_gain: float = 1.03,
             record: bool = True) -> planning.Plan:
        """`polyspec deploy plan`: the speed model over the fleet as deployed (registry.planning); open
        recommendations are stored unless ``record`` is False."""
        with self.session(write=record) as s:
            deps, stats = planning.with_shared_steps(deployments.views(s)), deployments.live_stats(s)
            langs = planning.language_plans(deps, stats, min_share=min_share, min_speedup=min_speedup)
            ks = planning.k_plans(deps, langs, stats)
            recs = planning.recommendations(langs, ks, min_share=min_share, min_k_gain=min_k_gain)
            if record:
                planning.store(s, recs)
            return planning.Plan(langs, ks, recs)

    def recommendations(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Open recommendations (oldest first), e.g. ``kind="train-draft"``."""
        with self.session() as s:
            return planning.open_recommendations(s, kind)

    def add_language(
        self, code: str, prompts_file: str | Path | None = None, verifier: str | None = None, **options: Any
    ) -> LanguageProfileRecord:
        return profiles.add_language(self, code, prompts_file, verifier, **options)

    def languages(self, *, verifier: str | None = None) -> list[LanguageProfileRecord]:
        with self.session() as s:
            return profiles.list_profiles(s, verifier=verifier)

    def get_language(self, code: str, *, verifier: str | None = None) -> LanguageProfileRecord:
        with self.session() as s:
            return profiles.get_profile(s, code, verifier=verifier)

    def events(self, limit: int = 100) -> list[EventRecord]:
        with self.session() as s:
            rows = s.scalars(select(Event).order_by(Event.id.desc()).limit(limit))
            return [EventRecord.of(r) for r in rows]

    def export_json(self) -> dict[str, Any]:
        with self.session() as s:
            return transfer.export_all(s)

    def import_json(self, data: Mapping[str, Any]) -> dict[str, int]:
        """Merge an export into this registry (all or nothing); returns rows added per table."""
        with self.session(write=True) as s:
            return transfer.import_all(s, data)

    # -- locks and adaptation (registry.locks, registry.adaptation) ---------------------------
    def acquire_lock(self, name: str, holder: str, ttl_s: float, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Take (or renew) the lease ``name``; `LockHeld` while another live holder has it."""
        with self.session(write=True) as s:
            return locks.acquire(s, name, holder, ttl_s, dict(details or {}))

    def heartbeat_lock(self, name: str, holder: str, ttl_s: float, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
        with self.session(write=True) as s:
            return locks.heartbeat(s, name, holder, ttl_s, dict(details) if details is not None else None)

    def release_lock(self, name: str, holder: str) -> bool:
        with self.session(write=True) as s:
            return locks.release(s, name, holder)

    def locks(self) -> list[dict[str, Any]]:
        with self.session() as s:
            return locks.list_locks(s)

    def record_adaptation(self, step: str, language: str, /, *, who: str, attempt: str | None = None,
                          status: str = "done", **details: Any) -> AdaptEventRecord:
        """One audit event of `polyspec adapt` (registry.adaptation)."""
        with self.session(write=True) as s:
            return adaptation.record(s, step, language, who=who, attempt=attempt, status=status, **details)

    def adaptation_events(self, language: str | None = None, *, steps: list[str] | None = None,
                          attempt: str | None = None, limit: int = 1000) -> list[AdaptEventRecord]:
        with self.session() as s:
            return adaptation.events(s, language, steps=steps, attempt=attempt, limit=limit)

    def last_adaptation(self, language: str, step: str, *, status: str | None = None) -> AdaptEventRecord | None:
        with self.session() as s:
            return adaptation.last(s, language, step, status=status)

    def observe_traffic(self, counters: Mapping[str, Mapping[str, float]], *, who: str) -> None:
        with self.session(write=True) as s:
            adaptation.observe(s, counters, who=who)

    def traffic_observation(self, at: float) -> dict[str, Any] | None:
        """The newest stored traffic snapshot taken at or before ``at`` (Unix seconds)."""
        with self.session() as s:
            return adaptation.observation_before(s, at)

    def update_launch(self, deployment: str, *, set_keys: Mapping[str, Any] | None = None, remove: list[str] = (),
                      who: str = "adapt") -> DeploymentView:
        with self.session(write=True) as s:
            return adaptation.update_launch(s, deployment, set_keys=set_keys, remove=remove, who=who)

    def set_draft_status(self, ref: DraftRef, status: str, *, who: str, why: str) -> DraftRecord:
        with self.session(write=True) as s:
            row = draft_row(s, ref)
            adaptation.set_draft_status(s, row.name, row.version, status, who=who, why=why)
            return DraftRecord.of(row)


def _check_acceptance(acceptance: list[float], k: int, method: str) -> list[float]:
    if method not in EVAL_METHODS:
        raise InvalidEvaluation(f"method must be one of {', '.join(EVAL_METHODS)}, not {method!r}")
    acc = [float(a) for a in acceptance]
    if k < 1 or len(acc) != k:
        raise InvalidEvaluation(f"acceptance has {len(acc)} positions but k = {k}")
    if any(not 0.0 <= a <= 1.0 for a in acc):
        raise InvalidEvaluation(f"acceptance rates must lie in [0, 1]: {acc}")
    if any(b > a + 1e-9 for a, b in zip(acc, acc[1:])):
        raise InvalidEvaluation(f"acceptance must not increase with position (P(>= i accepted)): {acc}")
    return acc
