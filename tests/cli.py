"""`polyspec ...` run in the test process: the same root command, options, error mapping and exit codes as
`python -m polyspec.cli ...`, without a new interpreter that imports torch, transformers and speculators again
(5-10 s a call on 2 cores). The process boundary itself (the entry point, `--help` not importing torch, signals)
is tested through real subprocesses in tests/test_cli.py and the integration tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner


@contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set in os.environ (and the cached settings forgotten) for the block, then restored."""
    from polyspec.core.settings import reset_settings_cache

    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    reset_settings_cache()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_settings_cache()


def invoke(app: Any, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run the Typer ``app`` (or command function) with ARGS in process and ``env`` set; returns what
    subprocess.run(capture_output=True, text=True) would. An exception the command does not map to an exit code
    (a bug, a traceback in a real run) is raised here, so it fails the test instead of hiding in stderr."""
    if not isinstance(app, typer.Typer):
        app = _single(app)
    with environment(env):
        result = CliRunner().invoke(app, list(args), catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def _single(command: Any) -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.command()(command)
    return app


def polyspec(*args: str, home: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """`polyspec ARGS` in process (see invoke), with POLYSPEC_HOME=``home`` when given."""
    from polyspec.cli import app

    if home is not None:
        env = {"POLYSPEC_HOME": str(home), **env}
    return invoke(app, *args, **env)
