"""`polyspec adapt`: turn live traffic into better drafts and swap them in (docs/adaptation.md).

    polyspec adapt --dry-run            # what it would do now, and why (nothing is written)
    polyspec adapt once                 # one cycle: triggers -> train -> gate -> canary -> swap or rollback
    polyspec adapt --every 30m          # a cycle every 30 minutes, until Ctrl-C
    polyspec adapt rollback it          # back to the draft Italian had before its last swap
    polyspec adapt history [it]         # the audit trail: triggers, trainings, gates, canaries, swaps
    polyspec adapt status               # the lock, canaries in flight, interrupted trainings

It lives in the application layer: it joins training (models, torch), engines and the registry.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import ValidationError
from rich.table import Table
from sqlalchemy.exc import OperationalError

from polyspec.adapt.canary import CANARY_KEY
from polyspec.adapt.cycle import LockKeeper, rollback_language, run_cycle
from polyspec.adapt.settings import AdaptSettings
from polyspec.adapt.triggers import assess
from polyspec.core.cli import PolyspecTyper
from polyspec.core.console import console
from polyspec.core.errors import InvalidInput, PolyspecError, Unavailable
from polyspec.core.languages import resolve_language
from polyspec.fleet.run import sigterm_as_interrupt
from polyspec.registry import RegistryError, open_registry
from polyspec.registry.adaptation import figure, summary
from polyspec.registry.locks import LockHeld, holder_id

app = PolyspecTyper(help="Closed-loop adaptation: train drafts from live traffic, gate, canary and swap them.",
                    no_args_is_help=False, invoke_without_command=True)
_EVERY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 60}
MIN_EVERY_S = 10.0


class RegistryBusy(Unavailable):
    """The registry database is locked by another writer (or unreachable): adapt changed nothing."""


def parse_every(text: str) -> float:
    """'30m', '2h', '45s', '1d', or minutes as a bare number -> seconds."""
    m = _EVERY.match(text or "")
    if not m:
        raise InvalidInput(f"--every {text!r}: give a duration like 30m, 2h, 45s or 1d")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds < MIN_EVERY_S:
        raise InvalidInput(f"--every {text!r}: at least {MIN_EVERY_S:g} s between cycles")
    return seconds


def _settings() -> Any:
    try:
        return AdaptSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(f"POLYSPEC_ADAPT_{str(first['loc'][0]).upper()}: {first['msg']}") from None


def _open(url: str | None) -> Any:
    return open_registry(url)


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _console() -> Any:
    return console()


def print_assessment(assessment: Any) -> None:
    out = _console()
    since = (time.strftime("%Y-%m-%d %H:%M", time.localtime(assessment.window_since))
             if assessment.window_since else "the registry's first traffic")
    seen = Table(title=f"live traffic since {since}")
    for col in ("language|domain", "requests", "tokens/s", "plain tokens/s", "MAL"):
        seen.add_column(col, justify="left" if col == "language|domain" else "right")
    for key, fig in assessment.observed.items():
        seen.add_row(key, str(fig["requests"]), figure(fig["tokens_per_s"]), figure(fig["plain_tokens_per_s"]), figure(fig["mal"], 3))
    out.print(seen)
    table = Table(title="polyspec adapt: what it would do")
    for col in ("language", "domain", "decision", "triggers", "requests", "captured", "new", "why"):
        table.add_column(col, overflow="fold")
    for a in assessment.actions:
        decision = a.decision + (" (next)" if a.chosen else "")
        table.add_row(a.language, a.domain, decision, ", ".join(t.kind for t in a.triggers) or "-", str(a.requests),
                      str(a.captured), str(a.new_prompts), a.why)
    out.print(table if assessment.actions else "[green]no language needs adapting[/]")


def dry_run(registry: str | None, as_json: bool) -> None:
    with _open(registry) as reg:
        assessment = assess(reg, _settings())
    _echo_json(assessment.to_json()) if as_json else print_assessment(assessment)


def _with_lock(registry: str | None, body: Any, *, who_role: str = "adapt") -> Any:
    """Run ``body(reg, settings, who, keeper)`` holding the adapt lock; a held lock and a locked registry are
    refused with an event (when the registry can take one) and nothing else changes."""
    s = _settings()
    who = holder_id(who_role)
    with _open(registry) as reg:
        try:
            with LockKeeper(reg, who, s.lock_ttl_s) as keeper:
                return body(reg, s, who, keeper)
        except LockHeld as exc:
            _note(reg, who, "refused", f"another adapt process acts: {exc}")
            raise
        except (OperationalError, RegistryError) as exc:
            if "locked" not in str(exc).lower():
                raise
            _note(reg, who, "failed", f"registry locked: {exc}")
            raise RegistryBusy(f"the registry is locked by another writer; nothing was changed ({exc})") from None


def _note(reg: Any, who: str, status: str, reason: str) -> None:
    """Record why adapt did not act; a registry that stays locked only gets the line on stderr."""
    for _ in range(3):
        try:
            reg.record_adaptation("lock", "*", who=who, status=status, reason=reason[:2000])
            return
        except Exception:  # noqa: BLE001 - still locked: try a little later
            time.sleep(1.0)
    typer.echo(f"could not record in the registry: {reason}", err=True)


def once(registry: str | None, as_json: bool) -> Any:
    say = (lambda msg: None) if as_json else (lambda msg: _console().print(f"[dim]adapt:[/] {msg}"))
    with sigterm_as_interrupt():  # `kill` as Ctrl-C: a canary in flight is withdrawn, a training child stopped
        result = _with_lock(registry, lambda reg, s, who, keeper: run_cycle(reg, s, who=who, say=say,
                                                                            check=keeper.check))
    if as_json:
        _echo_json(result.to_json())
    else:
        if result.assessment is not None:
            print_assessment(result.assessment)
        _console().print(f"adapt once: [bold]{result.status}[/]" + (f" ({result.language}, {result.attempt})"
                                                                      if result.language else ""))
        if result.details.get("reason"):
            _console().print(f"  {result.details['reason']}")
    return result


@app.callback()
def main(
    ctx: typer.Context,
    dry_run_flag: bool = typer.Option(False, "--dry-run", help="Print what a cycle would do now and why; change nothing."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    every: Optional[str] = typer.Option(None, "--every", help="Run a cycle every DURATION (30m, 2h, ...) until Ctrl-C."),
    registry: Optional[str] = typer.Option(None, "--registry", help="Registry URL (default: POLYSPEC_REGISTRY_URL)."),
) -> None:
    """Closed-loop adaptation (docs/adaptation.md). Settings: POLYSPEC_ADAPT_* environment variables."""
    # The gate runs torch here, beside busy engines: spinning OpenMP threads make it many times slower on a
    # shared CPU (measured in training/eval_cli.py); it only takes effect before torch is imported, as here.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ctx.obj = {"registry": registry, "json": as_json, "dry_run": dry_run_flag}
    if ctx.invoked_subcommand is not None:
        return
    if every is not None:
        seconds = parse_every(every)
        if dry_run_flag:
            raise InvalidInput("--every acts; use --dry-run alone to see what it would do")
        loop(registry, seconds, as_json)
    elif dry_run_flag:
        dry_run(registry, as_json)
    else:
        typer.echo(ctx.get_help())


def loop(registry: str | None, seconds: float, as_json: bool) -> None:
    """A cycle every ``seconds``; a cycle that fails (lock held, registry busy) is reported and the loop goes on.
    Ctrl-C or SIGTERM stops it (a cycle in its canary withdraws the candidate first)."""
    try:
        with sigterm_as_interrupt():
            while True:
                started = time.monotonic()
                try:
                    once(registry, as_json)
                except PolyspecError as exc:
                    typer.echo(f"adapt: cycle skipped: {exc}", err=True)
                time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    except KeyboardInterrupt:
        typer.echo("adapt: stopped", err=True)


class AdaptLoop:
    """`polyspec up --adapt-every`: `polyspec adapt --every` as a child process beside the router (a process of
    its own: a cycle trains and starts engines, which must not stall the router's event loop). It refreshes
    that router after each change unless POLYSPEC_ADAPT_ROUTER_URLS names routers; SIGTERM at the end
    withdraws a canary in flight (as Ctrl-C would)."""

    def __init__(self, seconds: float, registry: str | None, log_path: Any) -> None:
        self.seconds, self.registry, self.log_path = seconds, registry, log_path
        self.proc: Any = None

    def start(self, router_base: str) -> None:
        env = dict(os.environ)
        env.setdefault("POLYSPEC_ADAPT_ROUTER_URLS", json.dumps([router_base]))
        cmd = [sys.executable, "-m", "polyspec.cli", "adapt", "--every", f"{self.seconds:g}s"]
        cmd += ["--registry", self.registry] if self.registry else []
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _console().print(f"adapt: a cycle every {self.seconds:g} s (pid {self.proc.pid}, log {self.log_path})")

    def stop(self, timeout: float = 120.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:  # a canary that will not withdraw in time: the next cycle recovers it
            self.proc.kill()
            self.proc.wait()


@app.command("once")
def once_cmd(ctx: typer.Context,
             dry_run_flag: bool = typer.Option(False, "--dry-run", help="Only print what it would do."),
             as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """One cycle: triggers, training from captured traffic, gate, canary, then swap or rollback."""
    opts = ctx.obj or {}
    as_json = as_json or opts.get("json", False)
    if dry_run_flag or opts.get("dry_run"):
        dry_run(opts.get("registry"), as_json)
        return
    result = once(opts.get("registry"), as_json)
    if result.status == "failed":
        raise typer.Exit(1)


@app.command("rollback")
def rollback_cmd(ctx: typer.Context, language: str = typer.Argument(..., help="Language whose last swap to undo."),
                 as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Return LANGUAGE to the draft it had before its last swap (or withdraw its running canary)."""
    lang = resolve_language(language).code
    opts = ctx.obj or {}
    done = _with_lock(opts.get("registry"), lambda reg, s, who, keeper: rollback_language(
        reg, s, lang, who=who, check=keeper.check), who_role="rollback")
    _echo_json(done) if as_json or opts.get("json") else _console().print(f"rolled back {lang}: {done}")


@app.command("history")
def history_cmd(ctx: typer.Context, language: Optional[str] = typer.Argument(None, help="One language (default: all)."),
                limit: int = typer.Option(200, min=1, max=100_000, help="Newest events shown."),
                as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """The adaptation timeline: triggers, trainings, gates, canaries, swaps and rollbacks, with figures."""
    opts = ctx.obj or {}
    with _open(opts.get("registry")) as reg:
        events = reg.adaptation_events(language, limit=limit)
    if as_json or opts.get("json"):
        _echo_json([e.model_dump(mode="json") for e in events])
        return
    table = Table(title="adaptation timeline")
    for col in ("when", "language", "step", "status", "attempt", "figures"):
        table.add_column(col, overflow="fold")
    for e in events:
        when = e.created_at.strftime("%Y-%m-%d %H:%M:%S") if e.created_at else "-"
        table.add_row(when, e.language, e.step, e.status, e.attempt or "-", summary(e))
    _console().print(table)


@app.command("status")
def status_cmd(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """The adapt lock, canaries in flight and interrupted trainings."""
    opts = ctx.obj or {}
    with _open(opts.get("registry")) as reg:
        data = {"locks": reg.locks(),
                "canaries": [{"deployment": d.name, "draft": d.draft, **(d.launch or {}).get(CANARY_KEY, {})}
                             for d in reg.active_deployments() if (d.launch or {}).get(CANARY_KEY)],
                "trainings": unfinished_trainings(reg)}
    _echo_json(data) if as_json or opts.get("json") else _console().print(data)


def unfinished_trainings(reg: Any) -> list[dict[str, Any]]:
    """Per language, its last training event when that one is started or interrupted (the next cycle resumes it)."""
    last: dict[str, Any] = {}
    for event in reg.adaptation_events(steps=["training"], limit=500):
        last[event.language] = event
    return [e.model_dump(mode="json") for e in last.values() if e.status in ("started", "interrupted")]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="adapt")
