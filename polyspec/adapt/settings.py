"""`polyspec adapt`'s knobs: one pydantic-settings class, read from ``POLYSPEC_ADAPT_*`` environment variables.

docs/adaptation.md lists them with what an operator sees when they fire. Defaults suit a production fleet
(a window of 30 minutes, hundreds of prompts); the tests and the CPU demo set small values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from polyspec.router.config import RouterConfig


class AdaptSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POLYSPEC_ADAPT_", extra="ignore")

    # Triggers.
    window_s: float = Field(default=1800.0, gt=0, description="Traffic window the triggers judge (seconds).")
    min_requests: int = Field(default=50, ge=1, description="Requests of a language (or domain) in the window "
                              "before its speed is judged, or before it counts as traffic without a draft.")
    target_speedup: float = Field(default=1.3, gt=0, description="Observed tokens/s must reach this times the "
                                  "speculation-free tokens/s (live, or the speed model's prediction).")
    target_mal: float = Field(default=1.8, ge=1.0, description="While there are no speed figures: the live mean "
                              "acceptance length a language must reach.")
    target_tps: dict[str, float] = Field(default_factory=dict, description="Absolute tokens/s targets per "
                                         "language; they replace the speed-up target where given.")
    min_share: float = Field(default=0.05, ge=0.0, le=1.0, description="Share of traffic a language without a "
                             "draft needs before a draft is trained for it.")
    min_new_prompts: int = Field(default=500, ge=1, description="New captured prompts since the language's last "
                                 "draft that trigger a new one.")
    min_train_prompts: int = Field(default=200, ge=2, description="Captured prompts a training needs (held-out "
                                   "part included).")
    cooldown_s: float = Field(default=6 * 3600.0, ge=0, description="No new attempt for a language this soon "
                              "after its last one, whatever its outcome.")
    languages: list[str] = Field(default_factory=list, description="Only these languages (empty: all).")
    capture_dir: Path | None = Field(default=None, description="Captured prompts (default: the router's, "
                                     "POLYSPEC_ROUTER_CAPTURE_DIR or $POLYSPEC_HOME/capture).")

    # Data from traffic.
    seed: int = Field(default=0, description="Seed of the train / held-out split (a hash of seed and prompt).")
    heldout_fraction: float = Field(default=0.1, gt=0.0, lt=1.0)
    min_heldout: int = Field(default=8, ge=1)
    max_heldout: int = Field(default=200, ge=1)
    max_train_prompts: int = Field(default=5000, ge=1)
    replay_ratio: float = Field(default=1.0, ge=0.0, le=10.0, description="Captured prompts of the other served "
                                "languages mixed in per training prompt, so the draft does not forget them (0: none).")

    # Training.
    answers: Literal["engine", "offline"] = Field(default="engine", description="engine: a running engine of a "
                                                  "deployment answers (the serving verifier); offline: the same "
                                                  "model through transformers.")
    answer_tokens: int = Field(default=256, ge=8)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    epochs: int | None = Field(default=None, ge=1, description="None: the recipe's (training.config).")
    lr: float | None = Field(default=None, gt=0)
    warmup_steps: int | None = Field(default=None, ge=0)
    total_seq_len: int | None = Field(default=None, ge=64)
    train_command: str | None = Field(default=None, description="Shell command that runs the stages up to fit "
                                      "elsewhere (a GPU box, a batch queue); {run_id} and {home} are filled in. "
                                      "Default: `polyspec train run --run-id RUN --resume --until fit` here.")
    train_timeout_s: float = Field(default=6 * 3600.0, gt=0)
    min_free_gib: float = Field(default=2.0, ge=0, description="Free disk under POLYSPEC_HOME a training needs.")

    # Gate.
    gate_delta: float = Field(default=0.02, ge=0, description="Gain in mean acceptance length the candidate needs "
                              "on its language's held-out live set, both answer subsets.")
    gate_margin: float = Field(default=0.02, ge=0, description="Largest drop tolerated on MT-Bench: its language's, "
                               "English's and the other served languages'.")
    gate_questions: int = Field(default=40, ge=1, description="MT-Bench questions per language (turn 1).")
    gate_tokens: int = Field(default=128, ge=8, description="New tokens per answer in the gate.")

    # Canary and swap.
    canary_share: float = Field(default=0.1, gt=0.0, le=1.0, description="Share of the language's traffic the "
                                "candidate engine gets during the canary.")
    canary_min_requests: int = Field(default=30, ge=2, description="Canary requests (and as many of the old "
                                     "engine) before the comparison.")
    canary_timeout_s: float = Field(default=1800.0, gt=0, description="A canary without enough traffic by then "
                                    "is rolled back.")
    canary_poll_s: float = Field(default=10.0, gt=0)
    canary_alpha: float = Field(default=0.05, gt=0, lt=0.5, description="One-sided level of the tests that roll "
                                "back a canary measurably slower or accepting less than the old engine.")
    engine_ready_timeout_s: float = Field(default=900.0, gt=0)
    engine_threads: int | None = Field(default=None, ge=1, description="OMP threads of the candidate engine "
                                       "(default: as the engine it is compared with).")
    self_check: bool = Field(default=True, description="Self-check the candidate engine before it gets traffic.")
    calibrate: bool = Field(default=True, description="Calibrate the candidate engine for the speed policy.")
    router_urls: list[str] = Field(default_factory=list, description="Routers to refresh after each change "
                                   "(their admin API); without, adapt waits router_refresh_s.")
    router_refresh_s: float = Field(default=35.0, ge=0, description="Wait for routers to reload the registry "
                                    "(their refresh interval plus a margin) when router_urls is empty.")
    drain_timeout_s: float = Field(default=120.0, ge=0, description="Longest wait for an old engine's requests.")
    inplace: bool = Field(default=False, description="Replace draft weights in place instead of a new engine; "
                          "no supported backend yet (docs/adaptation.md), so True is refused.")

    # Coordination.
    lock_ttl_s: float = Field(default=120.0, ge=5, description="Lease of the adapt lock; renewed every third.")

    @field_validator("inplace")
    @classmethod
    def _inplace(cls, value: bool) -> bool:
        if value:
            raise ValueError("no supported backend replaces draft weights in place yet (vLLM's weight-update "
                             "endpoints need a GPU weight-transfer engine; docs/adaptation.md): use blue-green")
        return value

    @field_validator("languages")
    @classmethod
    def _codes(cls, value: list[str]) -> list[str]:
        return [code.strip().lower() for code in value if code.strip()]

    @field_validator("router_urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"router URL must start with http:// or https://, not {url!r}")
        return [url.rstrip("/") for url in value]

    @field_validator("target_tps")
    @classmethod
    def _targets(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not v > 0}
        if bad:
            raise ValueError(f"tokens/s targets must be positive: {bad}")
        return {k.strip().lower(): float(v) for k, v in value.items()}

    def resolved_capture_dir(self) -> Path:
        if self.capture_dir is not None:
            return self.capture_dir.expanduser()
        return RouterConfig().resolved_capture_dir()  # where the routers of this environment write
