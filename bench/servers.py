"""Starting the systems under test for the router benchmarks, each as its own process on 127.0.0.1.

- the fake OpenAI backend (bench/fake_openai.py), shared by every system;
- polyspec: `polyspec serve` over a fresh SQLite registry with one default deployment at the backend;
- the LiteLLM proxy (.venv-bench), one worker, master key, offline switches;
- vllm-router 0.1.17 (.venv-bench), round_robin.

``cpus`` pins a process with taskset so the router under test and the load generator get separate cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import BENCH_VENV, ROOT, BenchError, require_bench_venv, stop_process, wait_http
from polyspec.core.ports import free_port

LITELLM_KEY = "sk-polyspec-bench"
LITELLM_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "True",
               "LITELLM_DISABLE_LATEST_RELEASE_CHECK": "True", "LITELLM_MASTER_KEY": LITELLM_KEY,
               "LITELLM_LOG": "ERROR", "DISABLE_ADMIN_UI": "True"}
SERVED_LANGUAGES = ["en", "fr", "de", "es", "it", "ru", "zh", "ja", "ko"]


@dataclass
class Server:
    name: str
    url: str  # base URL without /v1
    proc: subprocess.Popen
    log: Path
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc)


def _pin(cmd: list[str], cpus: str | None) -> list[str]:
    if cpus and shutil.which("taskset"):
        return ["taskset", "-c", cpus, *cmd]
    return cmd


def _spawn(name: str, cmd: list[str], workdir: Path, cpus: str | None, env: dict[str, str] | None = None) -> tuple:
    log = workdir / f"{name}.log"
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(_pin(cmd, cpus), stdout=log.open("w"), stderr=subprocess.STDOUT, env=full_env,
                            cwd=str(ROOT), start_new_session=True)
    return proc, log


def _ready(server: Server, path: str, timeout: float) -> Server:
    try:
        wait_http(server.url + path, timeout, server.proc, headers=server.headers)
    except BenchError as exc:
        tail = server.log.read_text(errors="replace")[-1500:] if server.log.exists() else ""
        server.stop()
        raise BenchError(f"{server.name}: {exc}\n{tail}") from None
    return server


def start_backend(workdir: Path, cpus: str | None, tokens: int = 16, token_delay_ms: float = 0.0) -> Server:
    port = free_port()
    cmd = [sys.executable, str(ROOT / "bench" / "fake_openai.py"), "--port", str(port), "--tokens", str(tokens),
           "--token-delay-ms", str(token_delay_ms)]
    proc, log = _spawn("backend", cmd, workdir, cpus)
    return _ready(Server("backend", f"http://127.0.0.1:{port}", proc, log), "/health", 60)


def make_registry(workdir: Path, deployments: list[tuple[str, str, list[str], bool]], url: str | None = None) -> str:
    """A fresh registry (SQLite in ``workdir`` unless ``url`` names another, empty one) with the bundled
    verifier and bare-verifier deployments ``(name, url, languages, is_default)``; returns its URL."""
    from polyspec.registry import open_registry

    url = url or f"sqlite:///{workdir / 'registry.db'}"
    reg = open_registry(url)
    try:
        reg.add_verifier("smollm2-135m-instruct")
        for name, base, langs, default in deployments:
            reg.deploy(None, name=name, url=base, languages=langs, default=default)
    finally:
        reg.close()
    return url


def start_polyspec(workdir: Path, registry_url: str, cpus: str | None, threshold: float | None = None,
                   extra_env: dict[str, str] | None = None, router_id: str = "bench") -> Server:
    port = free_port()
    cmd = [str(ROOT / ".venv" / "bin" / "polyspec"), "serve", "--registry", registry_url, "--port", str(port),
           "--log-level", "warning", "--router-id", router_id]
    if threshold is not None:
        cmd += ["--threshold", str(threshold)]
    env = {"POLYSPEC_ROUTER_DEFAULT_LANGUAGE": "en", "POLYSPEC_REGISTRY_URL": registry_url, **(extra_env or {})}
    name = "polyspec" if router_id == "bench" else f"polyspec-{router_id}"  # one log per router
    proc, log = _spawn(name, cmd, workdir, cpus, env)
    return _ready(Server(name, f"http://127.0.0.1:{port}", proc, log), "/ready", 120)


def start_python_floor(workdir: Path, backend_url: str, cpus: str | None, server: str = "uvicorn") -> Server:
    """bench/python_floor.py: polyspec's server and upstream client with nothing on top (its module says why);
    ``server``: that forwarding under another HTTP server (python_floor.SERVERS)."""
    port = free_port()
    cmd = [sys.executable, str(ROOT / "bench" / "python_floor.py"), "--port", str(port), "--backend", backend_url,
           "--server", server]
    name = "python_floor" if server == "uvicorn" else f"python_floor-{server}"
    proc, log = _spawn(name, cmd, workdir, cpus)
    return _ready(Server(name, f"http://127.0.0.1:{port}", proc, log), "/health", 60)


def start_litellm(workdir: Path, backend_url: str, cpus: str | None) -> Server:
    require_bench_venv("litellm")
    port = free_port()
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: polyspec\n"
        "    litellm_params:\n"
        "      model: openai/fake-engine\n"
        f"      api_base: {backend_url}/v1\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  telemetry: false\n"
    )
    cmd = [str(BENCH_VENV / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
           "--num_workers", "1"]
    proc, log = _spawn("litellm", cmd, workdir, cpus, LITELLM_ENV)
    server = Server("litellm", f"http://127.0.0.1:{port}", proc, log, {"Authorization": f"Bearer {LITELLM_KEY}"})
    return _ready(server, "/health/liveliness", 180)


def start_vllm_router(workdir: Path, backend_url: str, cpus: str | None) -> Server:
    require_bench_venv()
    port = free_port()
    # Its metrics exporter defaults to the fixed port 29000: a free one, so it cannot collide with a straggler.
    cmd = [str(BENCH_VENV / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", backend_url, "--policy", "round_robin", "--log-level", "warning",
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    proc, log = _spawn("vllm_router", cmd, workdir, cpus)
    return _ready(Server("vllm_router", f"http://127.0.0.1:{port}", proc, log), "/health", 120)
