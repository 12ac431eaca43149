"""Every knob of polyspec, read from the environment (prefix ``POLYSPEC_``).

The defaults are the ones the README and the tests are written against.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POLYSPEC_", extra="ignore")

    home: Path = Field(
        default=Path("~/.cache/polyspec"),
        description="Cache directory for verifiers, runs, hidden states and the default registry.",
    )
    registry_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the registry. Default: a SQLite file in `home`.",
    )
    default_verifier: str = Field(default="smollm2-135m-instruct")
    default_language: str = Field(default="en", description="Language of the default pool.")
    admin_token: str | None = Field(default=None, description="Bearer token for /admin.")
    engine_eager: bool = Field(
        default=False,
        description="Start every vLLM engine polyspec launches with --enforce-eager (no graph compilation). "
        "Measured on 2 CPU cores with an Eagle3 draft: ready in 26 s instead of 74 s (compile cache warm) "
        "or 120 s (cold), 64 tokens in 1.53 s instead of 1.43 s. For tests and quick trials, not for speed figures.",
    )
    max_draft_bytes: int = Field(
        default=25_000_000,
        gt=0,
        description="Largest weights file (model.safetensors) a training run may make: a run whose predicted draft "
        "is larger is refused before any stage. The default is the cap on a draft shipped in git.",
    )

    def model_post_init(self, __context: object) -> None:
        self.home = self.home.expanduser()

    @property
    def resolved_registry_url(self) -> str:
        if self.registry_url:
            return self.registry_url
        return f"sqlite:///{self.home / 'registry.db'}"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def reset_settings_cache() -> None:
    """Forget cached settings (tests change the environment between cases)."""
    get_settings.cache_clear()
