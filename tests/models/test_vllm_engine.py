from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import httpx
import pytest

from polyspec.models.vllm_engine import (
    EngineError, EngineFailedToStart, EngineSpec, SpecCounters, VllmEngine, parse_spec_decode_counters,
)

METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 21.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 9.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 5.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 2.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 2.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_parse_counters_sums_engines() -> None:
    c = parse_spec_decode_counters(METRICS)
    assert c == SpecCounters(num_drafts=10, num_draft_tokens=30, num_accepted_tokens=7, accepted_per_pos=[5, 2, 0])
    assert parse_spec_decode_counters("") == SpecCounters()
    delta = c - SpecCounters(4, 12, 1, [1])
    assert delta == SpecCounters(6, 18, 6, [4, 2, 0])


def test_engine_spec_command_and_env(tmp_path: Path) -> None:
    spec = EngineSpec(verifier=tmp_path / "v", draft=tmp_path / "d", k=4, kv_cache_gib=3, cpu_bind="nobind", threads=1)
    cmd = spec.command(8123)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    cfg = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert cfg == {"method": "eagle3", "model": str(tmp_path / "d"), "num_speculative_tokens": 4}
    assert cmd[cmd.index("--per-request-spec-decode-metrics") + 1] == "summary"
    env = spec.environment()
    assert (env["VLLM_CPU_KVCACHE_SPACE"], env["VLLM_CPU_OMP_THREADS_BIND"], env["OMP_NUM_THREADS"]) == ("3", "nobind", "1")
    plain = EngineSpec(verifier=tmp_path / "v").command(1)
    assert "--speculative-config" not in plain and "--per-request-spec-decode-metrics" not in plain


def test_engine_eager_setting_adds_enforce_eager_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from polyspec.core.settings import reset_settings_cache

    monkeypatch.setenv("POLYSPEC_ENGINE_EAGER", "0")
    reset_settings_cache()
    assert "--enforce-eager" not in EngineSpec(verifier=tmp_path / "v").command(1)
    monkeypatch.setenv("POLYSPEC_ENGINE_EAGER", "1")
    reset_settings_cache()
    assert EngineSpec(verifier=tmp_path / "v").command(1)[-1] == "--enforce-eager"
    both = EngineSpec(verifier=tmp_path / "v", extra_args=["--enforce-eager"]).command(1)
    assert both.count("--enforce-eager") == 1
    monkeypatch.setenv("POLYSPEC_ENGINE_EAGER", "maybe")
    reset_settings_cache()
    with pytest.raises(ValueError):
        EngineSpec(verifier=tmp_path / "v").command(1)
    monkeypatch.delenv("POLYSPEC_ENGINE_EAGER")
    reset_settings_cache()


def test_engine_dtype_auto_follows_cpu_flags_and_explicit_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def dtype_arg(spec: EngineSpec) -> str:
        cmd = spec.command(1)
        return cmd[cmd.index("--dtype") + 1]

    monkeypatch.setenv("POLYSPEC_ENGINE_DEVICE", "cpu")
    spec = EngineSpec(verifier=tmp_path / "v")
    assert spec.dtype == "auto"  # the default
    monkeypatch.setenv("POLYSPEC_CPU_FLAGS", "sse2 avx2 fma")  # the AVX2-only EPYC of the bug report
    assert dtype_arg(spec) == "float32"
    monkeypatch.setenv("POLYSPEC_CPU_FLAGS", "avx2 avx512f avx512_bf16")  # this AMD EPYC: bf16 measured wrong
    assert dtype_arg(spec) == "float32"
    monkeypatch.setenv("POLYSPEC_CPU_FLAGS", "avx2 avx512f avx512_bf16 amx_bf16")  # a Xeon with AMX: CI failed at bf16
    assert dtype_arg(spec) == "float32"
    monkeypatch.setenv("POLYSPEC_ENGINE_DEVICE", "cuda")
    assert dtype_arg(spec) == "bfloat16"
    monkeypatch.setenv("POLYSPEC_ENGINE_DEVICE", "cpu")
    monkeypatch.setenv("POLYSPEC_CPU_FLAGS", "avx2")
    assert dtype_arg(EngineSpec(verifier=tmp_path / "v", dtype="bfloat16")) == "bfloat16"  # explicit wins
    assert dtype_arg(EngineSpec(verifier=tmp_path / "v", dtype="Float32")) == "float32"
    with pytest.raises(ValueError, match="unknown dtype"):
        EngineSpec(verifier=tmp_path / "v", dtype="int4")


def test_engine_start_logs_the_dtype_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYSPEC_ENGINE_DEVICE", "cpu")
    monkeypatch.setenv("POLYSPEC_CPU_FLAGS", "avx2")
    # `false` exits at once: only what start() records before the server runs is under test here.
    spec = EngineSpec(verifier=tmp_path / "v", extra_args=[])
    engine = VllmEngine(spec, tmp_path / "engine.log")
    monkeypatch.setattr(EngineSpec, "command", lambda self, port: ["false"])
    engine.start()
    engine.stop()
    assert engine.dtype_choice is not None and engine.dtype_choice.dtype == "float32"
    first = (tmp_path / "engine.log").read_text().splitlines()[0]
    assert first.startswith("# polyspec: dtype float32 (auto: vllm-cpu's bf16 does not reproduce") and "; cpu: " in first


def test_failed_start_reports_log_tail(tmp_path: Path) -> None:
    spec = EngineSpec(verifier=tmp_path / "v", extra_args=["--no-such-flag-polyspec"])
    engine = VllmEngine(spec, tmp_path / "engine.log").start()
    with pytest.raises(EngineFailedToStart, match="no-such-flag-polyspec") as err:
        engine.wait_ready(timeout=300, progress=False)
    assert "exited with status" in str(err.value)
    engine.stop()
    engine.stop()  # idempotent


@pytest.fixture(scope="module")
def engine(engine_processes) -> VllmEngine:
    """The session's shared English engine (tests/conftest.py), an engine start fewer: a real draft (k = 3) and
    the default dtype (auto), as users get it: float32 on a CPU. At bf16, vllm-cpu answered the question below
    "L'Étoile, la Marseillaise, ..." on EPYC hosts and on a CI host (docs/engines.md)."""
    eng = engine_processes["en"]
    assert eng.spec.k == 3 and eng.spec.dtype == "auto" and eng.spec.served_model_name == "smollm2"
    return eng


@pytest.mark.integration
def test_engine_answers_with_spec_metrics(engine: VllmEngine) -> None:
    def counters() -> SpecCounters:
        return parse_spec_decode_counters(httpx.get(f"{engine.url}/metrics", timeout=30).text)

    before = counters()
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24,
        "temperature": 0,
    }
    reply = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=300).json()
    choice = engine.dtype_choice
    assert "Paris" in reply["choices"][0]["message"]["content"], (reply, choice.to_json() if choice else None)
    spec = reply["metrics"]["speculative_decoding"]
    assert spec["num_spec_steps"] > 0 and spec["num_draft_tokens"] == 3 * spec["num_spec_steps"]
    assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"]
    delta = counters() - before
    assert delta.num_draft_tokens == spec["num_draft_tokens"]
    assert delta.num_accepted_tokens == spec["num_accepted_draft_tokens"]
    assert delta.num_drafts == spec["num_spec_steps"]
    assert sum(delta.accepted_per_pos) == spec["num_accepted_draft_tokens"]


@pytest.mark.integration
def test_engine_with_a_draft_passes_its_self_check(engine: VllmEngine, verifier) -> None:
    # Greedy speculative decoding must produce the verifier's own tokens, draft or no draft.
    from polyspec.models.selfcheck import ensure_reference

    reference, _ = ensure_reference(verifier.path)
    report = engine.self_check(reference)
    assert report.ok and engine.failed is None and engine.process is not None


def test_a_port_already_in_use_is_refused_before_launching(tmp_path: Path) -> None:
    """Another process answering on the engine's port would pass its /health off as this engine's (and a fleet
    would publish its URL): start() refuses, and launches nothing."""
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        port = squatter.getsockname()[1]
        engine = VllmEngine(EngineSpec(verifier=tmp_path / "v", port=port), tmp_path / "engine.log")
        with pytest.raises(EngineError, match=f"port {port} on 127.0.0.1 is already in use"):
            engine.start()
    assert engine.process is None and not (tmp_path / "engine.log").exists()
