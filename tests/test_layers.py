"""The layers at run time: what a fresh interpreter has loaded after importing the router, core, or running
the router's commands. import-linter (scripts/lint.sh) checks the import statements; these tests check what
really gets loaded, which also catches a heavy import reached through a plugin, a registry hook or a typer
callback that static analysis cannot follow.

Each check runs in a subprocess: this pytest process has long since imported torch for other tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "vllm", "speculators")

# Imports the modules one at a time and names, for each heavy package, the first module whose import
# loaded it: a failure then points at the culprit instead of at "the router".
_PROBE = r"""
import importlib, importlib.util, json, pkgutil, sys
heavy, roots, extra = json.loads(sys.argv[1])
def walk(name, path):  # without importing (pkgutil.walk_packages imports subpackages, blurring the culprit)
    found = [name]
    for m in pkgutil.iter_modules(path):
        sub = f"{name}.{m.name}"
        found += walk(sub, [f"{p}/{m.name}" for p in path]) if m.ispkg else [sub]
    return found
names = list(extra)
for root in roots:
    names += walk(root, list(importlib.util.find_spec(root).submodule_search_locations))
culprits = {}
for name in names:
    importlib.import_module(name)
    for h in heavy:
        if h in sys.modules and h not in culprits:
            culprits[h] = name
print(json.dumps({"imported": names, "culprits": culprits}))
"""


def _probe(heavy: tuple[str, ...], roots: list[str], extra: list[str] = ()) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps([heavy, roots, list(extra)])],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_router_loads_no_ml_stack() -> None:
    """Every module of polyspec.router (app, cli, admin, ...) imports without torch, transformers, vllm."""
    result = _probe(HEAVY, ["polyspec.router"], ["polyspec.router.app", "polyspec.router.cli"])
    assert {"polyspec.router.app", "polyspec.router.cli"} <= set(result["imported"])
    assert result["culprits"] == {}, f"heavy package loaded by (package: first module that loaded it): " \
                                     f"{result['culprits']}"


def test_core_is_a_light_leaf() -> None:
    result = _probe((*HEAVY, "sqlalchemy", "fastapi"), ["polyspec.core"])
    assert len(result["imported"]) > 5  # the walk found core's modules (an empty walk would pass vacuously)
    assert result["culprits"] == {}, f"polyspec.core loaded {result['culprits']}"


# Runs the console script's entry point (pyproject: polyspec = "polyspec.cli:app") and reports, at exit,
# which heavy packages the process had loaded.
_CLI = r"""
import atexit, json, sys
heavy = json.loads(sys.argv[1])
atexit.register(lambda: print("\nLOADED=" + json.dumps([h for h in heavy if h in sys.modules])))
sys.argv = ["polyspec", *sys.argv[2:]]
from polyspec.cli import app
app()
"""


@pytest.mark.parametrize("command", ["up", "serve"])
def test_router_commands_help_loads_no_torch(command: str) -> None:
    done = subprocess.run([sys.executable, "-c", _CLI, json.dumps(HEAVY), command, "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Usage" in done.stdout and command in done.stdout  # it printed this command's help
    loaded = json.loads(done.stdout.rsplit("LOADED=", 1)[1])
    assert loaded == [], f"`polyspec {command} --help` loaded {loaded}"


def test_product_tests_never_import_the_bench() -> None:
    """bench/ is the lab: its own tests live in tests/bench/; a product test that imported it would fail (or
    pass) with the lab. Helpers both use (the adaptation fleet, the fake OpenAI backend) live in tests/."""
    import ast

    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if (ROOT / "tests" / "bench") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n == "bench" or n.startswith("bench.")]
    assert offenders == [], offenders
