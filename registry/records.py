"""Plain pydantic views of registry rows.

Callers get these instead of live ORM objects, so nothing ever hits a detached-instance error
and everything serialises with ``model_dump(mode="json")``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from polyspec.core.counters import SpecCounts
from polyspec.registry import schema


class Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class VerifierRecord(Record):
    name: str
    location: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    checksums: dict[str, str] = Field(default_factory=dict)
    created_at: dt.datetime | None = None

    @classmethod
    def of(cls, row: schema.Verifier) -> VerifierRecord:
        return cls(
            name=row.name, location=row.location, architecture=row.architecture, vocab_size=row.vocab_size,
            hidden_size=row.hidden_size, num_layers=row.num_layers, checksums=dict(row.checksums or {}),
            created_at=row.created_at,
        )


class DraftRecord(Record):
    name: str
    version: int
    location: str
    verifier: str
    languages: list[str]
    domain: str
    draft_vocab_size: int
    k: int
    parent: str | None = None  # "name@version"
    provenance: dict[str, Any] = Field(default_factory=dict)
    status: str
    checksums: dict[str, str] = Field(default_factory=dict)
    created_at: dt.datetime | None = None

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @classmethod
    def of(cls, row: schema.Draft) -> DraftRecord:
        parent = f"{row.parent.name}@{row.parent.version}" if row.parent is not None else None
        return cls(
            name=row.name, version=row.version, location=row.location, verifier=row.verifier.name,
            languages=list(row.languages or []), domain=row.domain, draft_vocab_size=row.draft_vocab_size,
            k=row.k, parent=parent, provenance=dict(row.provenance or {}), status=row.status,
            checksums=dict(row.checksums or {}), created_at=row.created_at,
        )


class EvaluationRecord(Record):
    id: int | None = None
    draft: str  # "name@version"
    benchmark: str
    language: str
    domain: str = "general"
    k: int
    acceptance: list[float]
    mean_acceptance_length: float
    num_prompts: int = 0
    num_tokens: int = 0
    method: str
    subset: str = "all"  # "all" | "non_degenerate"
    degenerate_share: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    created_at: dt.datetime | None = None

    @classmethod
    def of(cls, row: schema.Evaluation) -> EvaluationRecord:
        return cls(
            id=row.id, draft=f"{row.draft.name}@{row.draft.version}", benchmark=row.benchmark,
            language=row.language, domain=row.domain, k=row.k, acceptance=list(row.acceptance or []),
            mean_acceptance_length=row.mean_acceptance_length, num_prompts=row.num_prompts,
            num_tokens=row.num_tokens, method=row.method, subset=row.subset or "all",
            degenerate_share=row.degenerate_share, details=dict(row.details or {}), created_at=row.created_at,
        )


class DeploymentView(Record):
    """One deployment as the router needs it: where to send traffic and how good the draft is."""

    name: str
    url: str | None = None
    launch: dict[str, Any] = Field(default_factory=dict)
    status: str = "active"
    draft: str | None = None  # "name@version"; None: the verifier alone, no speculation
    draft_name: str | None = None
    draft_version: int | None = None
    draft_location: str | None = None
    k: int | None = None
    verifier_name: str | None = None
    verifier_location: str | None = None
    languages: list[str] = Field(default_factory=list)
    domain: str = "general"
    is_default: bool = False
    offline_mal: dict[str, float] = Field(default_factory=dict)  # best mean acceptance length per language
    # The speed model's inputs (core.speed): per language, the offline per-position acceptance over all
    # answers and the prompts behind it; batch size -> seconds per step from the newest calibration.
    offline_acceptance: dict[str, list[float]] = Field(default_factory=dict)
    offline_samples: dict[str, int] = Field(default_factory=dict)
    step_s: dict[int, float] = Field(default_factory=dict)
    # Engines of one shape (registry.calibrations.engine_shape) share one step model; None: its own.
    step_shape: str | None = None
    created_at: dt.datetime | None = None


class CalibrationRecord(Record):
    deployment: str
    url: str
    draft_name: str
    k: int
    batch_size: int
    step_s: float
    tokens_per_s: float
    requests: int
    details: dict[str, Any] = Field(default_factory=dict)
    created_at: dt.datetime | None = None

    @classmethod
    def of(cls, row: schema.EngineCalibration) -> CalibrationRecord:
        return cls(deployment=row.deployment, url=row.url, draft_name=row.draft_name, k=row.k,
                   batch_size=row.batch_size, step_s=row.step_s, tokens_per_s=row.tokens_per_s,
                   requests=row.requests, details=dict(row.details or {}), created_at=row.created_at)


class LanguageProfileRecord(Record):
    language: str
    name: str
    verifier: str | None
    script: str
    is_latin: bool
    coverage: float  # of the recommended draft's vocabulary (else the best vocabulary's)
    coverage_reference: str
    coverage_by_vocab: dict[str, float] = Field(default_factory=dict)
    plan: str  # extend-multilingual | finetune | from-scratch-custom-vocab
    reason: str
    draft: str | None = None  # the draft that covers the language best ("name@version" or a shipped name)
    acceptance: float | None = None  # its mean acceptance length on the language
    acceptance_basis: str | None = None  # measured | predicted | predicted-unseen-script | none
    fits: list[dict[str, Any]] = Field(default_factory=list)  # every draft: coverage, acceptance, basis, ...
    text: str | None = None  # what coverage was measured on: "bundled sample" or "prompts"
    prompts_file: str | None = None
    num_prompts: int = 0
    updated_at: dt.datetime | None = None

    @classmethod
    def of(cls, row: schema.LanguageProfile, verifier_name: str | None) -> LanguageProfileRecord:
        cov = {str(k): float(v) for k, v in (row.coverage or {}).items()}
        best = max(cov.items(), key=lambda kv: kv[1]) if cov else ("none", 0.0)
        ref, share = (row.draft, cov[row.draft]) if row.draft in cov else best
        details = dict(row.details or {})
        return cls(
            language=row.code, name=row.name, verifier=verifier_name, script=row.script,
            is_latin=bool(row.is_latin), coverage=share, coverage_reference=ref, coverage_by_vocab=cov,
            plan=row.plan, reason=row.reason, draft=row.draft, acceptance=row.acceptance,
            acceptance_basis=row.acceptance_basis, fits=list(details.get("fits") or []), text=details.get("text"),
            prompts_file=row.prompts_file, num_prompts=row.num_prompts, updated_at=row.updated_at,
        )


class LiveStatRecord(Record):
    """Router telemetry aggregated over one key. ``router_id`` is "*" when summed across routers."""

    router_id: str = "*"
    language: str
    domain: str = "general"
    draft_name: str = "none"
    requests: int = 0
    completion_tokens: int = 0
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = Field(default_factory=list)
    generation_s: float = 0.0

    @property
    def counts(self) -> SpecCounts:
        """The row as the one counter type; every figure derives from it."""
        return SpecCounts(self.requests, self.completion_tokens, self.num_spec_steps, self.num_draft_tokens,
                          self.num_accepted_tokens, tuple(self.accepted_per_pos), self.generation_s)

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted drafts per step, as vLLM reports it; None before any speculative step."""
        return self.counts.mean_acceptance_length

    @property
    def acceptance(self) -> list[float]:
        return self.counts.acceptance


class EventRecord(Record):
    kind: str
    subject: str
    details: dict[str, Any] = Field(default_factory=dict)
    created_at: dt.datetime | None = None

    @classmethod
    def of(cls, row: schema.Event) -> EventRecord:
        return cls(kind=row.kind, subject=row.subject, details=dict(row.details or {}), created_at=row.created_at)


class PromotionResult(Record):
    draft: str
    languages: list[str]
    passed: bool
    forced: bool = False
    comparisons: list[dict[str, Any]] = Field(default_factory=list)
    failures: list[str] = Field(default_factory=list)
    retired: list[str] = Field(default_factory=list)
    repointed_deployments: list[str] = Field(default_factory=list)


class AdaptEventRecord(Record):
    """One step of `polyspec adapt` from the audit trail (registry.adaptation): ``language`` is the event's
    subject; ``attempt`` groups the steps of one adaptation; ``details`` holds the figures and checksums."""

    id: int
    kind: str  # adapt-trigger | adapt-training | adapt-gate | adapt-canary | adapt-swap | adapt-rollback | ...
    language: str
    step: str
    attempt: str | None = None
    status: str = "done"
    who: str = ""
    details: dict[str, Any] = Field(default_factory=dict)
    created_at: dt.datetime | None = None

    @classmethod
    def of(cls, row: schema.Event) -> AdaptEventRecord:
        details = dict(row.details or {})
        return cls(id=row.id, kind=row.kind, language=row.subject, step=row.kind.removeprefix("adapt-"),
                   attempt=details.get("attempt"), status=str(details.get("status", "done")),
                   who=str(details.get("who", "")), details=details, created_at=row.created_at)
