"""The router's knobs: one pydantic-settings class, read from ``POLYSPEC_ROUTER_*`` environment variables.

Everything the router does that could reasonably be tuned lives here, so that `polyspec serve`,
`polyspec up` and the tests configure it the same way.
"""

from __future__ import annotations

from polyspec.core.settings import get_settings

import ipaddress
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
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
    policy: Literal["speed", "mal"] = Field(
        default="speed",
        description="speed: the pool with the highest predicted tokens/s, speculation-free pools included "
        "(router.decision.speed, docs/speed.md; bench/speed_policy.py measures it against mal); mal: the pool whose draft "
        "has the best mean acceptance length, as before the speed policy.",
    )
    explore_share: float = Field(
        default=0.02, ge=0.0, le=0.5,
        description="Share of a (language, domain)'s requests sent to the candidate with the least evidence "
        "rather than the predicted fastest, so estimates cannot go stale; 0 turns exploration off.",
    )
    speed_confidence_z: float = Field(
        default=1.64, ge=0.0, le=5.0,
        description="The speed policy ranks by mean tokens per step minus z standard errors (1.64: one-sided 95 %).",
    )
    prior_step_requests: int = Field(
        default=20, ge=0,
        description="Weight (in requests) of a calibrated step time against the step times this router measures.",
    )

    # Upstream traffic.
    connect_timeout_s: float = Field(default=5.0, gt=0)
    read_timeout_s: float = Field(
        default=300.0, gt=0,
        description="Longest silence allowed from an engine (for a non-streamed answer: its whole generation). "
        "300 s covers 4,096 tokens at 14 tokens/s, a small CPU engine's pace.",
    )
    engine_read_timeouts_s: dict[str, float] = Field(
        default_factory=dict,
        description="Per-engine read timeout, by deployment name or engine URL; others use read_timeout_s.",
    )
    max_attempts: int = Field(default=3, ge=1, description="Replicas tried per request before giving up.")
    max_body_bytes: int = Field(
        default=1024 * 1024, ge=1024,
        description="Largest request body. Its decoding runs on the event loop at up to ~5 ms per MB for the "
        "worst shapes (bench/hostile.py), so 1 MB (about 250k tokens of text) keeps every body to a few ms.",
    )
    max_connections: int = Field(
        default=512, ge=1,
        description="Connections to one engine (each engine has its own pool; health probes use their own "
        "connections), so an engine that hangs cannot starve the others.",
    )
    upstream_keepalive_s: float = Field(
        default=4.0, gt=0,
        description="How long an idle engine connection is kept for reuse; below vLLM's (uvicorn's) 5 s "
        "keep-alive, so the router never reuses a connection the engine is closing.",
    )

    # Client side: what one client may cost the router.
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest time a client may take to send its whole request body (slowloris).",
    )
    max_header_bytes: int = Field(default=32 * 1024, ge=1024, description="Largest request head (all headers).")
    header_timeout_s: float = Field(
        default=10.0, gt=0,
        description="Longest time a connection may take to send a request head, from its first byte (or from "
        "connecting); a slower one is closed (slowloris on headers).",
    )
    drain_grace_s: float = Field(
        default=30.0, ge=0,
        description="On SIGTERM: how long in-flight requests may finish; streams still open then get an error event.",
    )
    cors_allow_origins: list[str] = Field(
        default_factory=list, description="Origins allowed to call the API from a browser (CORS); empty: none.",
    )

    # Health checks with hysteresis.
    health_interval_s: float = Field(default=5.0, gt=0)
    health_timeout_s: float = Field(default=2.0, gt=0)
    fail_threshold: int = Field(default=2, ge=1, description="Consecutive failures that mark a replica down.")
    recover_threshold: int = Field(default=2, ge=1, description="Consecutive successes that mark it up again.")

    # Memory.
    huge_pages: bool = Field(
        default=False, description="Once the language models are loaded, back the router's large anonymous memory "
                                   "with transparent huge pages (Linux; core.hugepages): fewer TLB misses per request, "
                                   "at the risk of compaction stalls where the kernel defragments on fault (opt-in).",
    )

    # Registry sync.
    refresh_interval_s: float = Field(default=30.0, gt=0, description="Routing table refresh period.")
    flush_interval_s: float = Field(default=30.0, gt=0, description="Live stats persistence period.")

    # Opt-in prompt capture for continuous adaptation: best effort, off the request path.
    capture: bool = Field(default=False, description="Keep prompts per language as JSONL (opt-in).")
    capture_dir: Path | None = Field(default=None, description="Default: $POLYSPEC_HOME/capture.")
    capture_queue: int = Field(default=1000, ge=1, description="Prompts waiting for the writer; more are dropped.")
    capture_max_prompt_chars: int = Field(default=32_000, ge=1, description="Longer prompts are not captured.")
    capture_file_bytes: int = Field(default=64 * 1024 * 1024, ge=4096, description="A language file rotates at this size.")
    capture_total_bytes: int = Field(
        default=1024 * 1024 * 1024, ge=4096, description="Oldest rotated files are deleted beyond this total.",
    )
    capture_retention_days: float = Field(default=30.0, gt=0, description="Rotated files older than this are deleted.")
    capture_write_timeout_s: float = Field(
        default=5.0, gt=0, description="A write slower than this (a hung disk) is abandoned and counted as dropped.",
    )

    # Admin surface (/admin).
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses or CIDRs of reverse proxies in front of the router; with any set, no client is "
        "local (a proxy makes every client look like loopback): /admin needs POLYSPEC_ADMIN_TOKEN, and the router "
        "does not start without one.",
    )
    admin_allowed_hosts: list[str] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1", "::1"],
        description="Host header values /admin answers (DNS-rebinding guard); '*' allows any. "
        "The router's own --host is always allowed.",
    )

    allowed_hosts: list[str] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1", "::1"],
        description="While the router listens on a loopback address: the Host header values every route "
        "answers (DNS-rebinding guard; /admin has admin_allowed_hosts); '*' allows any. The router's own "
        "--host is always allowed. Not applied when it listens on another address.",
    )

    model_aliases: list[str] = Field(
        default_factory=lambda: ["polyspec"], description="Model names the router accepts besides the engines' own."
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or CIDR network") from None
        return [entry.strip() for entry in value]

    def resolved_default_language(self) -> str:
        if self.default_language:
            return self.default_language

        return get_settings().default_language

    def resolved_capture_dir(self) -> Path:
        if self.capture_dir is not None:
            return self.capture_dir.expanduser()

        return get_settings().home / "capture"
