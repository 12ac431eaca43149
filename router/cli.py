"""`polyspec` commands contributed by the router package."""

from __future__ import annotations

import typer


def register(root: typer.Typer) -> None:
    """Mount this package's commands on the root CLI."""
