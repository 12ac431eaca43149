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
