"""Adaptation fixtures: a registry with the verifier described (no weights), helpers that write router-style
capture files and live stats, and the settings every test starts from (small thresholds, no waiting)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.router.conftest import fake_draft_dir, fake_verifier  # noqa: F401 - fixtures shared with the router tests

EN_DRAFT = "en-draft"


def capture_lines(directory: Path, language: str, prompts: list[str], domain: str = "general",
                  name: str | None = None) -> Path:
    """Append prompts as the router's capture writes them (router.capture), to LANG.jsonl or ``name``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name or f"{language}.jsonl")
    with path.open("a", encoding="utf-8") as fh:
        for text in prompts:
            fh.write(json.dumps({"id": f"capture-{language}-{uuid.uuid4().hex[:16]}", "lang": language,
                                 "domain": domain, "prompt": text, "source": "polyspec-router:test",
                                 "license": "user-provided"}, ensure_ascii=False) + "\n")
    return path


def italian(n: int, start: int = 0) -> list[str]:
    return [f"Domanda numero {i}: come si prepara una buona pasta al pomodoro fresco?" for i in range(start, start + n)]


def live(reg: Any, language: str, draft: str, requests: int, *, tokens_per_s: float = 10.0, mal: float = 1.5,
         domain: str = "general", router: str = "r1", tokens: int = 32) -> None:
    """Record live counters as a router flush would: ``requests`` answers of ``tokens`` tokens."""
    completion = requests * tokens
    steps = int(completion / mal) if draft != "none" else 0
    accepted = completion - steps if draft != "none" else 0
    per_pos = [accepted] if draft != "none" else []
    reg.record_live_stats(router, [{"language": language, "domain": domain, "draft_name": draft,
                                    "requests": requests, "completion_tokens": completion,
                                    "generation_s": completion / tokens_per_s, "num_spec_steps": steps,
                                    "num_draft_tokens": steps, "num_accepted_tokens": accepted,
                                    "accepted_per_pos": per_pos}])


@pytest.fixture()
def adapt_reg(registry_url: str, fake_verifier, fake_draft_dir: Path):  # noqa: F811
    """A registry with the described verifier and an English draft deployed (default) at an unused URL."""
    from polyspec.registry import open_registry

    reg = open_registry(registry_url)
    reg.add_verifier(fake_verifier)
    rec = reg.import_draft(fake_draft_dir, verifier=fake_verifier.name, name=EN_DRAFT, languages=["en"],
                           status="active")
    reg.deploy(rec.ref, name="en-engine", url="http://127.0.0.1:9", default=True)
    yield reg
    reg.close()


@pytest.fixture()
def capture_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "capture"
    monkeypatch.setenv("POLYSPEC_ADAPT_CAPTURE_DIR", str(path))
    return path


@pytest.fixture()
def settings(capture_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """Small thresholds: 10 requests judge a language, 20 captured prompts train one."""
    from polyspec.adapt.settings import AdaptSettings

    env = {"MIN_REQUESTS": "10", "MIN_TRAIN_PROMPTS": "20", "MIN_NEW_PROMPTS": "30", "COOLDOWN_S": "0",
           "MIN_HELDOUT": "2", "ROUTER_REFRESH_S": "0", "DRAIN_TIMEOUT_S": "2"}
    for key, value in env.items():
        monkeypatch.setenv(f"POLYSPEC_ADAPT_{key}", value)
    return AdaptSettings()


def snapshot(reg: Any) -> dict[str, Any]:
    """Everything the registry serves from: deployments (with launch specs) and drafts' statuses."""
    return {"deployments": [(d.name, d.draft, d.url, d.status, sorted((d.launch or {}).items()))
                            for d in reg.deployments(include_stopped=True)],
            "drafts": [(d.ref, d.status) for d in reg.drafts()]}
