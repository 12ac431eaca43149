"""Router test fixtures: a registry populated through its API, a router served by uvicorn in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.router.fakes import free_port


class ServedApp:
    """A FastAPI app on a real socket (streams and disconnects behave as in production)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime

    def __enter__(self) -> ServedApp:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("router did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)


def router_config(registry_url: str, **overrides: Any) -> Any:
    from router.config import RouterConfig

    base: dict[str, Any] = dict(
        registry_url=registry_url, router_id="test-router", default_language="en", language_threshold=0.5,
        health_interval_s=0.5, refresh_interval_s=3600, flush_interval_s=3600, fail_threshold=1,
        recover_threshold=1, connect_timeout_s=2, read_timeout_s=120, max_attempts=3,
    )
    base.update(overrides)
    return RouterConfig(**base)


@contextmanager
def serve_router(registry_url: str, **overrides: Any) -> Iterator[ServedApp]:
    from router.app import create_app

    app = create_app(router_config(registry_url, **overrides), mount_admin=False)
    with ServedApp(app) as served:
        yield served


@pytest.fixture()
def registry(registry_url: str, verifier: Any) -> Any:
    from registry import open_registry

    reg = open_registry(registry_url)
    reg.add_verifier(verifier)
    yield reg
    reg.close()


def add_draft(reg: Any, path: Path, verifier_name: str, name: str, languages: list[str],
              mal: dict[str, float] | None = None, domain: str = "general") -> str:
    """Import a real draft directory under ``name`` with offline evaluations giving these MALs; returns name@version."""
    rec = reg.import_draft(path, verifier=verifier_name, name=name, languages=languages, domain=domain, status="active")
    for language, value in (mal or {}).items():
        p = (value - 1.0) / 3
        reg.add_evaluation(f"{rec.name}@{rec.version}", benchmark="heldout", language=language, k=3,
                           acceptance=[p, p, p], method="offline")
    return f"{rec.name}@{rec.version}"


def chat(url: str, text: str, *, model: str = "polyspec", headers: dict[str, str] | None = None,
         timeout: float = 120, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0}
    body.update(extra)
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=timeout)
