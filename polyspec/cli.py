"""The root ``polyspec`` command. Each package contributes its own sub-app through ``register(root)``.

A part is imported only when one of its commands runs (or ``--help`` lists them all), so ``polyspec serve``
loads the router and not the training stack, and each part keeps its imports at its module's top. Errors
are mapped to exit codes in one place (:mod:`polyspec.core.cli`); every command listed here is wrapped by
it. A part whose dependencies are missing on this machine (the GPU box has no FastAPI; a router-only
install has no torch) is still listed, with the reason and the extra that brings it.
"""

from __future__ import annotations

import importlib
from typing import Any

import click
import typer
import typer.main
from typer.core import TyperGroup

from polyspec import __version__
from polyspec.core.cli import EXTRA_OF_MODULE, PolyspecTyper
from polyspec.core.errors import Unavailable

# (module, the root commands it registers or extends), in the order --help lists them.
SUB_APPS: dict[str, tuple[str, ...]] = {
    "polyspec.models.cli": ("models",),
    "polyspec.registry.cli": ("registry",),
    "polyspec.registry.cli_plan": ("deploy",),
    "polyspec.k8s.cli": ("deploy",),  # adds `deploy k8s` to the group above
    "polyspec.training.cli": ("train",),
    "polyspec.training.eval_cli": ("eval",),
    "polyspec.core.langid_cli": ("langid",),
    "polyspec.router.cli": ("serve", "route"),
    "polyspec.up": ("up",),
    "polyspec.demo": ("demo",),
    "polyspec.engines": ("engines",),
    "polyspec.adapt.cli": ("adapt",),
}
COMMANDS: dict[str, tuple[str, ...]] = {}  # command -> the modules that make it, in SUB_APPS order
for _module, _names in SUB_APPS.items():
    for _name in _names:
        COMMANDS[_name] = (*COMMANDS.get(_name, ()), _module)
UNAVAILABLE: dict[str, str] = {}  # module -> why it could not be imported (filled as parts are loaded)

_parts = PolyspecTyper()  # every loaded part registers here once
_loaded: set[str] = set()
_resolved: dict[str, click.Command] = {}


def _reason(exc: ImportError) -> str:
    top = (getattr(exc, "name", None) or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    return f"install the '{extra}' extra (missing module {top!r})" if extra else f"import failed: {exc}"


def _unavailable(name: str, reason: str) -> click.Command:
    def command() -> None:
        raise Unavailable(f"'polyspec {name}' is not available here: {reason}")

    command.__doc__ = f"(unavailable: {reason})"
    stub = PolyspecTyper()
    stub.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})(command)
    return typer.main.get_group(stub).commands[name]


def resolve(name: str) -> click.Command:
    """The command ``name``, importing the parts that make it the first time."""
    if name not in _resolved:
        for module_name in COMMANDS[name]:
            if module_name in _loaded:
                continue
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                UNAVAILABLE[module_name] = _reason(exc)
                _resolved[name] = _unavailable(name, UNAVAILABLE[module_name])
                return _resolved[name]
            module.register(_parts)
            _loaded.add(module_name)
        _resolved[name] = typer.main.get_group(_parts).commands[name]
    return _resolved[name]


class LazyGroup(TyperGroup):
    """The root group: lists every command by name and imports its part when it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> Any:
        return resolve(cmd_name) if cmd_name in COMMANDS else None


app = PolyspecTyper(
    name="polyspec",
    help="Multi-language speculator registry and router for vLLM.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    cls=LazyGroup,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """polyspec trains per-language Eagle3 drafts, keeps them in a registry and routes traffic to them."""


# The Typer object names every command too (what introspection and shell completion read); LazyGroup answers
# each name with the real command, so these placeholders are never called.
for _name in COMMANDS:
    app.command(_name, hidden=True)(lambda: None)

if __name__ == "__main__":
    app()
