"""The router's knobs: one pydantic-settings class, read from ``POLYSPEC_ROUTER_*`` environment variables.

Everything the router does that could reasonably be tuned lives here, so that `polyspec serve`,
`polyspec up` and the tests configure it the same way.
"""

from __future__ import annotations

from polyspec.core.settings import get_settings

import socket
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_router_id() -> str:
    return socket.gethostname() or "router"


class RouterConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POLYSPEC_ROUTER_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Address the router listens on.")
    port: int = Field(default=8000, ge=0, le=65535)
    router_id: str = Field(default_factory=_default_router_id, description="Name of this router in live stats.")
    registry_url: str | None = Field(default=None, description="Registry URL; default: POLYSPEC_REGISTRY_URL / home.")
    default_language: str | None = Field(default=None, description="Default pool language; default: POLYSPEC_DEFAULT_LANGUAGE.")

    # Language identification.
    language_threshold: float = Field(
        default=0.4, ge=0.0, le=1.0,
        description="Below this langid confidence a prompt goes to the default pool (0.4: chosen in docs/benchmarks.md).",
    )
    langid_max_chars: int = Field(default=500, ge=16, description="Prompt characters given to langid.")
    keep_alive_s: float = Field(
        default=75.0, gt=0,
        description="Idle keep-alive of client connections; longer than common client pools' idle expiry, "
        "so the server never closes a connection a client is about to reuse (bench/router_overhead.py).",
    )

    # Policy: live acceptance replaces offline evaluations as live evidence accumulates.
    prior_spec_steps: int = Field(
        default=2000, ge=0, description="Weight (in spec steps) of the offline MAL in the live/offline blend."
    )

    # Upstream traffic.
    connect_timeout_s: float = Field(default=5.0, gt=0)
    read_timeout_s: float = Field(default=600.0, gt=0, description="Longest silence allowed from an engine.")
    max_attempts: int = Field(default=3, ge=1, description="Replicas tried per request before giving up.")
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_connections: int = Field(default=512, ge=1)
    upstream_keepalive_s: float = Field(
        default=4.0, gt=0,
        description="How long an idle engine connection is kept for reuse; below vLLM's (uvicorn's) 5 s "
        "keep-alive, so the router never reuses a connection the engine is closing.",
    )

    # Health checks with hysteresis.
    health_interval_s: float = Field(default=5.0, gt=0)
    health_timeout_s: float = Field(default=2.0, gt=0)
    fail_threshold: int = Field(default=2, ge=1, description="Consecutive failures that mark a replica down.")
    recover_threshold: int = Field(default=2, ge=1, description="Consecutive successes that mark it up again.")

    # Registry sync.
    refresh_interval_s: float = Field(default=30.0, gt=0, description="Routing table refresh period.")
    flush_interval_s: float = Field(default=30.0, gt=0, description="Live stats persistence period.")

    # Opt-in prompt capture for continuous adaptation.
    capture: bool = Field(default=False, description="Keep prompts per language as JSONL (opt-in).")
    capture_dir: Path | None = Field(default=None, description="Default: $POLYSPEC_HOME/capture.")

    model_aliases: list[str] = Field(
        default_factory=lambda: ["polyspec"], description="Model names the router accepts besides the engines' own."
    )

    def resolved_default_language(self) -> str:
        if self.default_language:
            return self.default_language

        return get_settings().default_language

    def resolved_capture_dir(self) -> Path:
        if self.capture_dir is not None:
            return self.capture_dir.expanduser()

        return get_settings().home / "capture"
