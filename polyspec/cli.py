"""The root ``polyspec`` command. Each package contributes its own sub-app through ``register(root)``.

Errors are mapped to exit codes in one place (:mod:`polyspec.core.cli`); every command listed here is
wrapped by it. A part whose dependencies are missing on this machine (the GPU box has no FastAPI; a
router-only install has no torch) is still listed, with the reason and the extra that brings it.
"""

from __future__ import annotations

import importlib

import typer

from polyspec import __version__
from polyspec.core.cli import EXTRA_OF_MODULE, PolyspecTyper
from polyspec.core.errors import Unavailable

app = PolyspecTyper(
    name="polyspec",
    help="Multi-language speculator registry and router for vLLM.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# (module, the commands it registers): the names are listed even when the module cannot be imported.
SUB_APPS: dict[str, tuple[str, ...]] = {
    "polyspec.models.cli": ("models",),
    "polyspec.registry.cli": ("registry",),
    "polyspec.registry.cli_plan": ("deploy",),
    "polyspec.k8s.cli": (),  # adds `deploy k8s` to the group above
    "polyspec.training.cli": ("train",),
    "polyspec.training.eval_cli": ("eval",),
    "polyspec.router.cli": ("serve", "langid"),
    "polyspec.router.explain": ("route",),
    "polyspec.up": ("up",),
    "polyspec.demo": ("demo",),
    "polyspec.engines": ("engines",),
    "polyspec.adapt.cli": ("adapt",),
}
UNAVAILABLE: dict[str, str] = {}


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """polyspec trains per-language Eagle3 drafts, keeps them in a registry and routes traffic to them."""


def _unavailable_command(name: str, reason: str) -> None:
    def command() -> None:
        raise Unavailable(f"'polyspec {name}' is not available here: {reason}")

    command.__doc__ = f"(unavailable: {reason})"
    app.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})(command)


def _reason(exc: ImportError) -> str:
    top = (getattr(exc, "name", None) or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    return f"install the '{extra}' extra (missing module {top!r})" if extra else f"import failed: {exc}"


def _mount() -> None:
    for module_name, commands in SUB_APPS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            UNAVAILABLE[module_name] = _reason(exc)
            for name in commands:
                _unavailable_command(name, UNAVAILABLE[module_name])
            continue
        module.register(app)


_mount()

if __name__ == "__main__":
    app()
