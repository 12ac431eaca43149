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


def _mount() -> None:
    # Sub-apps are imported here so that a missing optional part never breaks the others.
    from models.cli import register as register_models
    from registry.cli import register as register_registry
    from router.cli import register as register_router
    from training.cli import register as register_training

    for register in (register_models, register_registry, register_training, register_router):
        register(app)


_mount()

if __name__ == "__main__":
    app()
