"""The `polyspec up --config fleet.yaml` file: which engines to run (or reach) and where the router listens.

Example::

    verifier: smollm2-135m-instruct      # alias, local directory or HF id
    router: {host: 127.0.0.1, port: 8000}
    engines:
      - name: en-general
        draft: /path/to/en-draft         # speculators Eagle3 dir; omit for plain decoding
        languages: [en]
        port: 8101
        default: true
        dtype: auto                      # the default; bfloat16/float32 force one
      - name: fr-general
        url: http://10.0.0.7:8000        # remote engine: registered, not launched
        draft: fr-draft                  # informational for remote engines
        languages: [fr]

The models are pydantic, so a bad file fails with one message that names the field.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from polyspec.core.errors import InvalidInput
from polyspec.core.hostcpu import normalize_dtype
from polyspec.core.yaml_model import read_mapping, validate


class FleetConfigError(InvalidInput):
    """The fleet YAML file is missing, unreadable or does not validate."""


class RouterListen(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)


class EngineEntry(BaseModel):
    """One backend. Exactly one of `port` (launch here) or `url` (remote, already running) applies."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")
    draft: str | None = Field(default=None, description="Draft directory (local launch) or name (remote).")
    languages: list[str] = Field(default_factory=list)
    domain: str = "general"
    port: int | None = Field(default=None, ge=1, le=65535)
    url: str | None = None
    default: bool = False
    k: int = Field(default=3, ge=1, le=16)
    max_model_len: int = Field(default=2048, ge=128)
    kv_cache_gib: int = Field(default=2, ge=1)
    dtype: str = Field(default="auto", description="'auto' (bf16 only with native CPU bf16 or on a GPU, else "
                       "float32; polyspec.core.hostcpu) or an explicit vLLM dtype, which wins.")
    cpu_bind: str | None = Field(default=None, description="VLLM_CPU_OMP_THREADS_BIND; see models.vllm_engine.")
    threads: int | None = Field(default=None, ge=1)
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("languages")
    @classmethod
    def _lower(cls, value: list[str]) -> list[str]:
        return [code.strip().lower() for code in value if code.strip()]

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        return normalize_dtype(value)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return value.rstrip("/") if value else value

    @property
    def remote(self) -> bool:
        return self.url is not None


class FleetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verifier: str | None = Field(default=None, description="Defaults to POLYSPEC_DEFAULT_VERIFIER.")
    router: RouterListen = Field(default_factory=RouterListen)
    engines: list[EngineEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> FleetConfig:
        names = [e.name for e in self.engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique, got {names}")
        ports = [e.port for e in self.engines if e.port is not None and not e.remote]
        if self.router.port in ports or len(set(ports)) != len(ports):
            raise ValueError("every launched engine and the router need their own port")
        if sum(e.default for e in self.engines) > 1:
            raise ValueError("at most one engine can be the default")
        return self


def load_fleet_config(path: Path) -> FleetConfig:
    """Read and validate a fleet YAML file, raising FleetConfigError with a one-line reason."""
    raw = read_mapping(path, FleetConfigError, "fleet config", "a mapping with an 'engines' list")
    return validate(FleetConfig, raw, FleetConfigError, f"fleet config {path}")
