"""`polyspec engines check`: can this host serve correctly? An operator runs it on a new machine.

It starts one vLLM engine for the verifier with the defaults (``dtype: auto``; with a draft when given),
computes or reads the verifier's cached reference while the engine loads, runs the self-check
(polyspec.core.selfcheck), and prints the dtype, the CPU features that decided it, and pass or fail.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer

from polyspec.core.cli import PolyspecTyper
from polyspec.core.errors import InvalidInput, PolyspecError
from polyspec.core.hostcpu import DTYPES, NATIVE_BF16_FLAGS, host_cpu_flags, normalize_dtype

app = PolyspecTyper(help="Check that this host's vLLM engines compute what the verifier computes.",
                  no_args_is_help=True)


def run_check(*, verifier: str | None, draft: Path | None, dtype: str, k: int, timeout: float,
              progress: bool) -> dict[str, Any]:
    """Start an engine, self-check it, stop it; the result as a JSON-able dict (``ok`` False on a failure)."""
    from polyspec.core.selfcheck import SelfCheckFailed
    from polyspec.core.settings import get_settings
    from polyspec.models.selfcheck import ensure_reference
    from polyspec.models.verifiers import resolve_verifier
    from polyspec.models.vllm_engine import EngineSpec, VllmEngine

    info = resolve_verifier(verifier or get_settings().default_verifier)
    spec = EngineSpec(verifier=info.path, draft=draft, k=k, dtype=dtype, served_model_name="polyspec-selfcheck")
    choice = spec.dtype_choice()
    present = host_cpu_flags()
    result: dict[str, Any] = {
        "ok": False, "verifier": str(info.path), "draft": str(draft) if draft else None, **choice.to_json(),
        "cpu_bf16_flags_checked": list(NATIVE_BF16_FLAGS), "cpu_has_avx512f": "avx512f" in present,
        "cpu_has_avx2": "avx2" in present,
    }
    engine = VllmEngine(spec, get_settings().home / "logs" / "engines-check.log")
    result["log"] = str(engine.log_path)
    started = time.monotonic()
    engine.start()
    try:
        reference, path = ensure_reference(info.path)  # overlaps the engine's start
        result["reference"] = str(path)
        engine.wait_ready(timeout=timeout, progress=progress)
        result["engine_start_s"] = round(time.monotonic() - started, 1)
        checked = time.monotonic()
        try:
            report = engine.self_check(reference)
            result.update(ok=True, selfcheck=report.to_json())
        except SelfCheckFailed as exc:
            result.update(error=str(exc), likely_cause=exc.hint, selfcheck=exc.details(), check_failed=True)
        result["check_s"] = round(time.monotonic() - checked, 1)
    except PolyspecError as exc:
        result["error"] = str(exc)
    except Exception as exc:  # an engine that does not start: reported like a failed check
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        engine.stop()
    return result


def _print_human(result: dict[str, Any]) -> None:
    flags = ", ".join(result.get("cpu_flags") or []) or "none"
    typer.echo(f"verifier : {result['verifier']}")
    typer.echo(f"draft    : {result['draft'] or 'none'}")
    typer.echo(f"dtype    : {result['dtype']}  ({result['reason']})")
    typer.echo(f"cpu bf16 : {flags}  (checked: {', '.join(result['cpu_bf16_flags_checked'])}; "
               f"avx512f: {'yes' if result['cpu_has_avx512f'] else 'no'})")
    check = result.get("selfcheck") or {}
    for case in check.get("cases", []):
        where = f"  (top-5 at {case['tolerated_at']})" if case["tolerated_at"] else ""
        where = where if case["ok"] else f"  first wrong token at {case['position']}"
        typer.echo(f"  {'ok  ' if case['ok'] else 'FAIL'} {case['prompt']!r}: {case['exact']} exact, "
                   f"{case['tolerated']} within top-5{where}")
    if "engine_start_s" in result:
        typer.echo(f"timing   : engine start {result['engine_start_s']} s, self-check {result.get('check_s', '-')} s")
    if result["ok"]:
        typer.echo(f"self-check: PASS ({check.get('summary', '')})")
    else:
        typer.echo(f"self-check: FAIL: {result.get('error', 'unknown error')}", err=True)
        typer.echo(f"engine log: {result['log']}", err=True)


@app.command("check")
def check(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
    draft: Optional[Path] = typer.Option(None, "--draft", exists=True, file_okay=False,
                                         help="A speculators Eagle3 draft directory to serve with the verifier."),
    dtype: str = typer.Option("auto", "--dtype", help=f"One of {', '.join(DTYPES)}; auto: bf16 only with native "
                              "CPU bf16 (avx512_bf16/amx_bf16) or on a GPU, float32 otherwise."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="Default: the bundled verifier."),
    k: int = typer.Option(3, min=1, max=16, help="Speculative tokens per step (with --draft)."),
    timeout: float = typer.Option(900.0, help="Seconds to wait for the engine to start."),
) -> None:
    """Start an engine with the defaults, self-check it against the verifier, print dtype, CPU flags, pass/fail.

    Exits 0 on pass, 6 when the engine fails the self-check, 5 when it does not start, 2 for a bad option."""
    try:
        dtype = normalize_dtype(dtype)
    except ValueError as exc:
        raise InvalidInput(f"--dtype: {exc}") from None
    # A verifier that cannot be resolved raises here; the root CLI maps it to its exit code.
    result = run_check(verifier=verifier, draft=draft, dtype=dtype, k=k, timeout=timeout, progress=not json_out)
    if json_out:
        typer.echo(json.dumps(result, indent=2))
    else:
        _print_human(result)
    if not result["ok"]:
        raise typer.Exit(6 if result.get("check_failed") else 5)  # IntegrityError / Unavailable exit codes


def register(root: typer.Typer) -> None:
    """Mount `polyspec engines` on the root CLI."""
    root.add_typer(app, name="engines")
