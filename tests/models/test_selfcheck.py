"""The engine self-check end to end: the verifier's reference (transformers), a deliberately corrupted engine
that must fail loudly, and `polyspec engines check --json` on the real verifier.

Two engine starts in all, at the same time: `polyspec engines check` starts in the background before the
corrupted engine does (an engine's start mostly waits, so two take about as long as one on 2 cores). Run under
`flock /tmp/polyspec-heavy.lock`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from polyspec.core.hostcpu import choose_dtype
from polyspec.core.selfcheck import PROMPTS, SelfCheckFailed, load_reference
from polyspec.models.selfcheck import ensure_reference
from polyspec.models.vllm_engine import EngineSpec, VllmEngine

REPO = Path(__file__).resolve().parents[2]


def test_reference_of_the_bundled_verifier_is_computed_once_and_cached(verifier) -> None:
    reference, path = ensure_reference(verifier.path)
    assert path.is_file() and load_reference(path) == reference
    assert [c.prompt for c in reference.cases] == list(PROMPTS)
    france = reference.cases[0]
    assert "Paris" in france.text and france.tokens[-1] == 2  # stops after <|im_end|>
    for case in reference.cases:
        assert 1 <= len(case.tokens) <= reference.max_tokens
        assert all(top[0] == tok and len(top) == 5 for tok, top in zip(case.tokens, case.top))
    again, same = ensure_reference(verifier.path)
    assert (again, same) == (reference, path)
    path.write_text("{broken")  # a damaged cache is recomputed, not fatal
    assert ensure_reference(verifier.path) == (reference, path)


def _corrupted_copy(src: Path, dest: Path) -> Path:
    """The verifier with its final norm negated: the logits flip sign, so the engine's greedy choice becomes
    the verifier's least likely token, a stand-in for an engine whose numerics are broken."""
    import torch
    from safetensors.torch import load_file, save_file

    dest.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy2(f, dest / f.name)
    weights = load_file(str(src / "model.safetensors"))
    weights["model.norm.weight"] = -weights["model.norm.weight"]
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dest / "model.safetensors"), metadata={"format": "pt"})
    assert not torch.equal(weights["model.norm.weight"], load_file(str(src / "model.safetensors"))["model.norm.weight"])
    return dest


@pytest.fixture(scope="module")
def engines_check(verifier) -> subprocess.Popen:
    """`polyspec engines check --json` on the real verifier, started before the corrupted engine's test so that
    both engines load at once; test_engines_check_json_passes_on_the_real_verifier reads its result."""
    env = {**os.environ, "POLYSPEC_DEFAULT_VERIFIER": verifier.name}
    proc = subprocess.Popen([sys.executable, "-m", "polyspec.cli", "engines", "check", "--json"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield proc
    if proc.poll() is None:  # its test did not read it: SIGINT, on which the command stops its engine
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)


@pytest.mark.integration
def test_corrupted_engine_fails_its_self_check_loudly(verifier, engines_check, tmp_path: Path) -> None:
    reference, _ = ensure_reference(verifier.path)  # what the real verifier says
    bad = _corrupted_copy(verifier.path, tmp_path / "corrupt")
    spec = EngineSpec(verifier=bad, served_model_name="corrupt", max_model_len=1024, kv_cache_gib=1)
    with VllmEngine(spec, tmp_path / "corrupt.log") as engine:
        with pytest.raises(SelfCheckFailed) as err:
            engine.self_check(reference)
        assert engine.failed is err.value
        assert engine.process is None  # stopped at once: a failed engine is never served
    message = str(err.value)
    assert f"engine {engine.url} failed its self-check" in message
    assert "not in its top-k" in message and "Likely cause:" in message
    report = err.value.report
    assert report is not None and not report.ok and report.failed[0].position == 0
    assert err.value.exit_code == 6


@pytest.mark.integration
def test_engines_check_json_passes_on_the_real_verifier(engines_check) -> None:
    stdout, stderr = engines_check.communicate(timeout=1200)
    assert engines_check.returncode == 0, stdout[-3000:] + stderr[-3000:]
    result = json.loads(stdout)
    expected = choose_dtype("auto")  # this host's answer, forced both ways in tests/core/test_hostcpu.py
    assert result["ok"] is True and result["requested"] == "auto"
    assert (result["dtype"], result["cpu_flags"], result["reason"]) == (expected.dtype, list(expected.flags),
                                                                       expected.reason)
    assert result["cpu_bf16_flags_checked"] == ["avx512_bf16", "amx_bf16"]
    cases = result["selfcheck"]["cases"]
    assert len(cases) == len(PROMPTS) and all(c["ok"] for c in cases)
    assert result["engine_start_s"] > 0 and result["check_s"] >= 0
