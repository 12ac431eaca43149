"""The root CLI mounts every part's commands and answers --help/--version quickly."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from polyspec import __version__


def test_every_part_mounts_in_the_full_install():
    from polyspec import cli

    assert cli.UNAVAILABLE == {}, f"sub-apps failed to import: {cli.UNAVAILABLE}"
    names = {c.name for c in cli.app.registered_commands} | {g.name for g in cli.app.registered_groups}
    assert {"models", "registry", "train", "serve", "langid", "up", "demo"} <= names


def test_version_and_help():
    from polyspec.cli import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == __version__
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0 and "registry" in result.output


def test_help_does_not_import_torch():
    code = "import sys; from polyspec.cli import app; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
