"""The root ``polyspec`` command. Each package contributes its own sub-app."""

from __future__ import annotations

import typer

from polyspec import __version__

app = typer.Typer(
    name="polyspec",
    help="Multi-language speculator registry and router for vLLM.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
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


_SUB_APPS = ("models.cli", "registry.cli", "training.cli", "router.cli", "polyspec.demo")


def _mount() -> None:
    # A machine may lack one part's dependencies (the GPU box has no FastAPI or SQLAlchemy):
    # the other parts must still work there, so a failed import only hides that part's commands.
    import importlib

    for module_name in _SUB_APPS:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            _UNAVAILABLE[module_name] = str(exc)
            continue
        module.register(app)


_UNAVAILABLE: dict[str, str] = {}

_mount()

if __name__ == "__main__":
    app()
