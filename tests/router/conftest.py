"""Router test fixtures: a registry populated through its API, a router served by uvicorn in a thread."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.conftest import SHARED_SERVED_NAME
from tests.router.fakes import BrokenEngine
from polyspec.core.ports import free_port


class ServedApp:
    """A FastAPI app on a real socket (streams and disconnects behave as in production). A router app is
    served with the router's own HTTP protocol, as `polyspec serve` serves it (router.edge.server: head limits,
    and the ConnectionHook its hot path uses); ``plain=True`` serves it with uvicorn's own, as an app that
    embeds the router would (the hot path then takes its plain-ASGI path)."""

    def __init__(self, app: Any, *, plain: bool = False) -> None:
        self.app = app
        self.port = free_port()
        options: dict[str, Any] = {}
        runtime = getattr(app.state, "runtime", None)
        if runtime is not None and not plain:
            from polyspec.router.edge.server import head_limited_protocol

            config = runtime.config
            options["http"] = head_limited_protocol(config.max_header_bytes, lambda: None, config.header_timeout_s)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on", timeout_graceful_shutdown=2, **options))
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
    from polyspec.router.config import RouterConfig

    base: dict[str, Any] = dict(
        registry_url=registry_url, router_id="test-router", default_language="en", language_threshold=0.5,
        health_interval_s=0.5, refresh_interval_s=3600, flush_interval_s=3600, fail_threshold=1,
        recover_threshold=1, connect_timeout_s=2, read_timeout_s=120, max_attempts=3,
    )
    base.update(overrides)
    return RouterConfig(**base)


@contextmanager
def serve_router(registry_url: str, *, plain: bool = False, **overrides: Any) -> Iterator[ServedApp]:
    from polyspec.router.app import create_app

    app = create_app(router_config(registry_url, **overrides), mount_admin=False)
    with ServedApp(app, plain=plain) as served:
        yield served


@pytest.fixture(scope="session")
def fake_verifier(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A verifier *description* (models.verifiers.VerifierInfo: what the registry records about a verifier)
    with a config.json stub where the weights would be. The router only reads registry rows, never the
    verifier's files, so its unit tests need neither the prepared weights nor torch. Same name and shape as
    the bundled verifier, so drafts built for that one (base_draft_dir) import against this row too."""
    from polyspec.models.verifiers import VerifierInfo

    root = tmp_path_factory.mktemp("fake-verifier")
    desc = VerifierInfo(name="smollm2-135m-instruct", path=root, architecture="LlamaForCausalLM", vocab_size=49152,
                        hidden_size=576, num_layers=30)
    (root / "config.json").write_text(json.dumps({
        "architectures": [desc.architecture], "model_type": "llama", "vocab_size": desc.vocab_size,
        "hidden_size": desc.hidden_size, "num_hidden_layers": desc.num_layers}))
    return desc


@pytest.fixture(scope="session")
def fake_draft_dir(fake_verifier: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A structurally valid speculators Eagle3 draft for ``fake_verifier`` (32-token draft vocabulary, a few
    KB of zero weights): enough for the registry's validation and for routing, never for an engine."""
    import numpy as np
    from safetensors.numpy import save_file

    out = tmp_path_factory.mktemp("fake-draft")
    v, draft_vocab = fake_verifier, 32
    (out / "config.json").write_text(json.dumps({
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "draft_vocab_size": draft_vocab,
        "target_hidden_size": v.hidden_size,
        "transformer_layer_config": {"vocab_size": v.vocab_size, "hidden_size": v.hidden_size, "num_hidden_layers": 1},
        "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"speculative_tokens": 3}],
                               "verifier": {"name_or_path": v.name}},
    }))
    t2d = np.zeros(v.vocab_size, dtype=bool)
    t2d[:draft_vocab] = True  # the draft proposes target ids 0..31, so d2t (target id - draft id) is all zero
    save_file({"lm_head.weight": np.zeros((draft_vocab, v.hidden_size), dtype=np.float16),
               "fc.weight": np.zeros((v.hidden_size, 8), dtype=np.float16),
               "d2t": np.zeros(draft_vocab, dtype=np.int64), "t2d": t2d}, str(out / "model.safetensors"))
    return out


@pytest.fixture()
def registry(request: pytest.FixtureRequest, registry_url: str, fake_verifier: Any) -> Any:
    """A fresh registry with the verifier registered: the real prepared one for tests that start engines
    (marked integration: the engines load it from the registered location), the description otherwise."""
    from polyspec.registry import open_registry

    real = request.node.get_closest_marker("integration") is not None
    reg = open_registry(registry_url)
    reg.add_verifier(request.getfixturevalue("verifier") if real else fake_verifier)
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


# The real engines are session fixtures of tests/conftest.py, shared with every area that needs one.
SERVED = SHARED_SERVED_NAME


@pytest.fixture(scope="session")
def engines(engine_processes) -> dict[str, tuple[str, Path]]:
    """lang -> (engine URL, draft directory)."""
    return {lang: (engine.url, engine.spec.draft) for lang, engine in engine_processes.items()}


@pytest.fixture()
def deployed(registry, verifier, engines):
    """en engine = default pool, fr engine = the French pool; returns lang -> (deployment, draft ref, url)."""
    refs = {}
    for lang, (url, draft) in engines.items():
        ref = add_draft(registry, draft, verifier.name, f"{lang}-draft", [lang], {lang: 1.5})
        registry.deploy(ref, name=f"{lang}-engine", url=url, default=(lang == "en"))
        refs[lang] = (f"{lang}-engine", ref, url)
    return refs


def chat(url: str, text: str, *, model: str = "polyspec", headers: dict[str, str] | None = None,
         timeout: float = 120, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0}
    body.update(extra)
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=timeout)


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of the router's /metrics whose labels include ``labels`` (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def wait_for(condition: Any, timeout: float, step: float = 0.1) -> bool:
    """Poll ``condition()`` until it is true or ``timeout`` seconds have passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return bool(condition())


def openai_error(resp: httpx.Response, status: int) -> dict:
    """Assert an OpenAI-style error ``{"error": {"message", "type", "param", "code"}}`` with this status."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


@pytest.fixture()
def error500(registry):
    """The default (English) pool is one engine that answers every completion with HTTP 500."""
    with BrokenEngine("error500") as fake:
        registry.deploy(None, name="broken", url=fake.url, languages=["en"], default=True)
        yield fake


@pytest.fixture()
def no_token(monkeypatch):
    """No admin token configured: /admin answers loopback clients (every test client here) only."""
    from polyspec.core.settings import reset_settings_cache

    monkeypatch.delenv("POLYSPEC_ADMIN_TOKEN", raising=False)
    reset_settings_cache()
    yield
    reset_settings_cache()


def admin_post(client, path: str):
    """A state-changing admin call as the dashboard makes it: a JSON body and the page's CSRF token
    (the polyspec_csrf cookie /admin sets, echoed in X-CSRF-Token). ``client``: a TestClient or httpx.Client
    with the router's base URL."""
    if "polyspec_csrf" not in client.cookies:
        assert client.get("/admin").status_code == 200
    return client.post(path, json={}, headers={"X-CSRF-Token": client.cookies.get("polyspec_csrf")})


def post_head(path: str, **headers: str | int) -> bytes:
    """A raw HTTP/1.1 POST head (``content_length=5`` -> ``content-length: 5``), for socket-level tests."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_raw_response(sock: socket.socket, timeout: float = 10) -> tuple[int, dict[str, str], dict]:
    """Status, headers and JSON body of a Content-Length response read off a raw socket."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        assert part, f"connection closed after {data!r}"
        data += part
    head, body = data.split(b"\r\n\r\n", 1)
    headers = {k.strip().lower().decode(): v.strip().decode()
               for k, v in (line.split(b":", 1) for line in head.split(b"\r\n")[1:])}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(head.split()[1]), headers, json.loads(body)
