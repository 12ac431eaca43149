"""The registry's tables (SQLAlchemy 2 declarative). Alembic migrations mirror this file.

Everything downstream (the router's routing table, the training pipeline's registration,
benchmarks) reads these rows; change them only together with a new migration.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Verifier(Base):
    __tablename__ = "verifiers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    location: Mapped[str] = mapped_column(Text)  # local dir or hub id
    architecture: Mapped[str] = mapped_column(String(100))
    vocab_size: Mapped[int] = mapped_column(Integer)
    hidden_size: Mapped[int] = mapped_column(Integer)
    num_layers: Mapped[int] = mapped_column(Integer)
    checksums: Mapped[dict[str, Any]] = mapped_column(default=dict)  # relative path -> sha256
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    drafts: Mapped[list[Draft]] = relationship(back_populates="verifier")


class Draft(Base):
    __tablename__ = "drafts"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer, default=1)
    location: Mapped[str] = mapped_column(Text)  # local dir or hub id
    checksums: Mapped[dict[str, Any]] = mapped_column(default=dict)  # relative path -> sha256
    verifier_id: Mapped[int] = mapped_column(ForeignKey("verifiers.id"))
    languages: Mapped[list[Any]] = mapped_column(default=list)  # ISO 639-1 codes
    domain: Mapped[str] = mapped_column(String(50), default="general")
    draft_vocab_size: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer, default=3)  # num_speculative_tokens it was made for
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("drafts.id"), nullable=True)
    provenance: Mapped[dict[str, Any]] = mapped_column(default=dict)  # data, recipe, hparams, code version
    status: Mapped[str] = mapped_column(String(20), default="candidate")  # candidate|active|retired
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    verifier: Mapped[Verifier] = relationship(back_populates="drafts")
    parent: Mapped[Draft | None] = relationship(remote_side=[id])
    evaluations: Mapped[list[Evaluation]] = relationship(back_populates="draft", cascade="all, delete-orphan")
    deployments: Mapped[list[Deployment]] = relationship(back_populates="draft")


class Evaluation(Base):
    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(primary_key=True)
    draft_id: Mapped[int] = mapped_column(ForeignKey("drafts.id"))
    benchmark: Mapped[str] = mapped_column(String(100))  # e.g. "mtbench", "heldout", "live"
    language: Mapped[str] = mapped_column(String(10))
    domain: Mapped[str] = mapped_column(String(50), default="general")
    k: Mapped[int] = mapped_column(Integer)
    acceptance: Mapped[list[Any]] = mapped_column(default=list)  # P(>= i accepted), i = 1..k
    mean_acceptance_length: Mapped[float] = mapped_column(Float)  # 1 + sum(acceptance)
    num_prompts: Mapped[int] = mapped_column(Integer, default=0)
    num_tokens: Mapped[int] = mapped_column(Integer, default=0)
    method: Mapped[str] = mapped_column(String(20))  # "offline" | "vllm" | "live"
    # which answers the figures cover: "all", or "non_degenerate" (repetition loops left out, models.degenerate)
    subset: Mapped[str] = mapped_column(String(20), default="all", server_default="all")
    degenerate_share: Mapped[float | None] = mapped_column(Float, nullable=True)  # of the answers; None: not measured
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    draft: Mapped[Draft] = relationship(back_populates="evaluations")


class Deployment(Base):
    __tablename__ = "deployments"

    id: Mapped[int] = mapped_column(primary_key=True)
    draft_id: Mapped[int | None] = mapped_column(ForeignKey("drafts.id"), nullable=True)  # None: no speculation
    verifier_id: Mapped[int | None] = mapped_column(ForeignKey("verifiers.id"), nullable=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    url: Mapped[str | None] = mapped_column(Text, nullable=True)  # remote engine, e.g. http://host:8000
    launch: Mapped[dict[str, Any]] = mapped_column(default=dict)  # launch spec for `polyspec up`
    languages: Mapped[list[Any]] = mapped_column(default=list)  # served languages; empty = the draft's
    domain: Mapped[str] = mapped_column(String(50), default="general")
    is_default: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(20), default="active")  # active|stopped
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    draft: Mapped[Draft | None] = relationship(back_populates="deployments")


class LanguageProfile(Base):
    __tablename__ = "language_profiles"

    id: Mapped[int] = mapped_column(primary_key=True)
    code: Mapped[str] = mapped_column(String(10))  # ISO 639-1 where one exists, else 639-3
    verifier_id: Mapped[int | None] = mapped_column(ForeignKey("verifiers.id"), nullable=True)
    name: Mapped[str] = mapped_column(String(100))
    script: Mapped[str] = mapped_column(String(50))
    is_latin: Mapped[int] = mapped_column(Integer)
    coverage: Mapped[dict[str, Any]] = mapped_column(default=dict)  # draft name (or "en-topN") -> fraction
    plan: Mapped[str] = mapped_column(String(40))  # extend-multilingual | finetune | from-scratch-custom-vocab
    reason: Mapped[str] = mapped_column(Text)
    # The draft that covers the language best ("name@version", or a shipped draft's name) and its mean
    # acceptance length there, measured or predicted (registry.covering); None: no draft for the verifier.
    draft: Mapped[str | None] = mapped_column(String(250), nullable=True)
    acceptance: Mapped[float | None] = mapped_column(Float, nullable=True)
    acceptance_basis: Mapped[str | None] = mapped_column(String(30), nullable=True)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)  # every draft's fit, the text measured
    prompts_file: Mapped[str | None] = mapped_column(Text, nullable=True)
    num_prompts: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    __table_args__ = (UniqueConstraint("code", "verifier_id"),)


class LiveStat(Base):
    """Router telemetry aggregates, one row per (router, language, domain, draft)."""

    __tablename__ = "live_stats"
    __table_args__ = (UniqueConstraint("router_id", "language", "domain", "draft_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    router_id: Mapped[str] = mapped_column(String(100))
    language: Mapped[str] = mapped_column(String(10))
    domain: Mapped[str] = mapped_column(String(50))
    draft_name: Mapped[str] = mapped_column(String(200))  # "none" when no speculation
    requests: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    num_spec_steps: Mapped[int] = mapped_column(Integer, default=0)
    num_draft_tokens: Mapped[int] = mapped_column(Integer, default=0)
    num_accepted_tokens: Mapped[int] = mapped_column(Integer, default=0)
    accepted_per_pos: Mapped[list[Any]] = mapped_column(default=list)  # steps accepting >= i drafts
    # wall seconds of the answered requests at the engine (dispatch to last byte): observed tokens/s is
    # completion_tokens / generation_s
    generation_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class EngineCalibration(Base):
    """One point of an engine's step-cost curve (core.speed): seconds per verify step (per token without a
    draft) at one batch size, measured by `polyspec engines calibrate`. The newest point per (deployment,
    batch size) is the one in use; older ones stay as history."""

    __tablename__ = "engine_calibrations"

    id: Mapped[int] = mapped_column(primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200), index=True)
    url: Mapped[str] = mapped_column(Text)
    draft_name: Mapped[str] = mapped_column(String(200))  # "name@version", or "none" without speculation
    k: Mapped[int] = mapped_column(Integer)  # num_speculative_tokens; 0 without speculation
    batch_size: Mapped[int] = mapped_column(Integer)
    step_s: Mapped[float] = mapped_column(Float)
    tokens_per_s: Mapped[float] = mapped_column(Float)  # per stream
    requests: Mapped[int] = mapped_column(Integer)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)  # spread, tokens, steps, max_tokens, host
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Recommendation(Base):
    """An open suggestion for an operator (or `polyspec adapt`), e.g. "train a draft for it", written by
    `polyspec deploy plan`. One open row per (kind, subject); closing it keeps it as history."""

    __tablename__ = "recommendations"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(40))  # train-draft | no-speculation | change-k
    subject: Mapped[str] = mapped_column(String(250))  # a language, or a deployment name
    status: Mapped[str] = mapped_column(String(20), default="open")  # open | done | dismissed
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the figures behind it
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class Event(Base):
    """Audit trail of decisions: promotions (forced or not, with the gate's comparisons), retirements."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(40))  # promote | promote-forced | retire | deploy | undeploy
    subject: Mapped[str] = mapped_column(String(250))  # e.g. "fr-ft@2" or a deployment name
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Lock(Base):
    """A named lease that one process holds at a time, e.g. "adapt" (`polyspec adapt`: only one adapt process
    acts on the fleet). The holder renews it (heartbeat); a lease whose ``expires_at`` has passed is stale and
    the next process takes it over. Times are Unix seconds: comparable on every backend, no time zones."""

    __tablename__ = "locks"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    holder: Mapped[str] = mapped_column(String(250))  # host:pid:random, see registry.locks.holder_id
    acquired_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)  # what the holder is doing, for operators
