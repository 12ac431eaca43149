"""The CLI's error mapping, in one place, and the Typer class every ``polyspec`` sub-app uses.

Every command is wrapped once, when it is registered: a :class:`~polyspec.core.errors.PolyspecError`
becomes ``error: MESSAGE`` on stderr (plus its hint, and a JSON object on stdout when the command was
given ``--json``) and the exception's ``exit_code``. A missing optional dependency becomes
:class:`Unavailable` naming the extra to install. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import typer

from polyspec.core.errors import InvalidInput, PolyspecError, Unavailable

# Which extra brings which module (pyproject's [project.optional-dependencies]).
EXTRA_OF_MODULE = {
    "torch": "ml", "transformers": "ml", "speculators": "ml", "safetensors": "ml", "gguf": "ml",
    "accelerate": "ml", "matplotlib": "ml", "datasets": "ml", "vllm": "serve",
}


def missing_extra(exc: ModuleNotFoundError) -> Unavailable | None:
    """An :class:`Unavailable` for an import of a module that an extra provides, else None."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    return Unavailable(f"this command needs the '{extra}' extra (module {top!r} is not installed)",
                       hint=f"pip install 'polyspec[{extra}]'")


def _as_polyspec_error(exc: BaseException) -> PolyspecError | None:
    if isinstance(exc, PolyspecError):
        return exc
    if isinstance(exc, ModuleNotFoundError):
        return missing_extra(exc)
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - pydantic is a core dependency
        return None
    if isinstance(exc, ValidationError):
        from polyspec.core.yaml_model import first_error

        return InvalidInput(first_error(exc))
    return None


def report(exc: PolyspecError, as_json: bool = False) -> None:
    """Print the error the one way every command prints errors."""
    if as_json:
        typer.echo(json.dumps({"error": exc.message, "kind": type(exc).__name__, "exit_code": exc.exit_code,
                               **exc.details()}, ensure_ascii=False, default=str))
    typer.secho(f"error: {exc.message}", fg="red", err=True)
    if exc.hint:
        typer.echo(f"hint: {exc.hint}", err=True)


def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap one command: known errors become a message and their exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            known = _as_polyspec_error(exc)
            if known is None:
                raise
            report(known, as_json=bool(kwargs.get("as_json") or kwargs.get("json_out")))
            raise typer.Exit(known.exit_code) from None

    return wrapper


def _guarding(register: Callable[[Callable[..., Any]], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        register(guard(fn))
        return fn  # the undecorated function stays callable from Python

    return decorator


class PolyspecTyper(typer.Typer):
    """A Typer whose commands and callbacks all go through :func:`guard`."""

    # Both keep Typer's parameters as *args/**kwargs (passed through unchanged), which mypy reads as a narrower
    # signature than Typer's keyword list.
    def command(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return _guarding(super().command(*args, **kwargs))

    def callback(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return _guarding(super().callback(*args, **kwargs))
