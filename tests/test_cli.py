"""The root CLI mounts every part's commands and answers --help/--version quickly."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from polyspec import __version__


def test_every_part_mounts_in_the_full_install():
    """Every part imports and registers its commands: the root group loads parts lazily, so resolve each one."""
    from polyspec import cli

    resolved = {name: cli.resolve(name) for name in cli.COMMANDS}
    assert cli.UNAVAILABLE == {}, f"sub-apps failed to import: {cli.UNAVAILABLE}"
    assert all(command.name == name for name, command in resolved.items())
    assert {"plan", "k8s"} <= set(resolved["deploy"].commands)  # two parts make `deploy`
    names = {c.name for c in cli.app.registered_commands} | {g.name for g in cli.app.registered_groups}
    assert set(name for commands in cli.SUB_APPS.values() for name in commands) <= names
    assert {"models", "registry", "train", "eval", "serve", "langid", "up", "demo", "engines"} <= names


def test_version_and_help():
    from polyspec.cli import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == __version__
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0 and "registry" in result.output


def test_help_does_not_import_torch():
    code = "import sys; from polyspec.cli import app; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_part_that_cannot_import_is_listed_with_the_extra_to_install():
    """Where a part's dependency is missing, its commands stay in --help and say which extra brings them."""
    code = """
import sys
from importlib.abc import MetaPathFinder

class NoVllm(MetaPathFinder):  # a router-only install: no vllm, as if the 'serve' extra were absent
    def find_spec(self, name, path=None, target=None):
        if name == "polyspec.engines":
            raise ModuleNotFoundError("No module named 'vllm'", name="vllm")

sys.meta_path.insert(0, NoVllm())
from typer.testing import CliRunner
from polyspec import cli
runner = CliRunner()
help_text = runner.invoke(cli.app, ["--help"]).output
assert "engines" in help_text and "unavailable" in help_text, help_text
res = runner.invoke(cli.app, ["engines", "check", "--json"])
assert res.exit_code == 5, (res.exit_code, res.output)
assert "install the 'serve' extra" in res.output, res.output
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
