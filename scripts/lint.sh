#!/usr/bin/env bash
# Lint step of `make test` (and `make lint`): ruff, the import-linter layer contracts in pyproject.toml, then
# mypy on core/ and router/ ([tool.mypy] in pyproject.toml). A failure of any exits non-zero, so CI fails
# before pytest starts.
#
# Why the staging tree: the design card keeps core/, models/, registry/, router/ and training/ as top-level
# folders and setuptools maps them to polyspec.core, polyspec.models, ... (package-dir in pyproject.toml).
# grimp, which import-linter uses to build the import graph, finds a package's modules by walking the one
# folder the package is imported from, so it cannot see subpackages that live in other folders (an editable
# install's path hooks do not help it). build/lint/polyspec/ is therefore a folder of symlinks laid out as
# the installed package is, built from the package-dir table itself so it cannot drift from the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_BIN=$(cd "${VENV_BIN:-.venv/bin}" && pwd)  # absolute: the import check runs from another folder
STAGE=build/lint

# All checks always run (one report of everything), and any failing fails the step.
status=0
echo "==> ruff"
"$VENV_BIN/ruff" check . || status=1

echo "==> import-linter (layers, router/core isolation)"
rm -rf "$STAGE"
mkdir -p "$STAGE"
"$VENV_BIN/python" - "$STAGE" <<'EOF'
import os
import sys
import tomllib
from pathlib import Path

stage = Path(sys.argv[1]).resolve()
root = Path.cwd().resolve()
mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
top = stage / "polyspec"
top.mkdir()
# The root package's own folder holds modules and packages (cli.py, adapt/, ...): link them one by one, so the
# mapped subpackages can sit beside them in the staging folder.
for entry in (root / mapping["polyspec"]).iterdir():
    if entry.name != "__pycache__" and (entry.suffix == ".py" or entry.is_dir()):
        (top / entry.name).symlink_to(os.path.relpath(entry, top))
for name, folder in mapping.items():
    if name == "polyspec":
        continue
    parts = name.split(".")[1:]
    link = top.joinpath(*parts)
    if link.exists() or link.is_symlink():
        link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(root / folder, link.parent))
EOF
# lint-imports puts its working directory first on sys.path, and the checkout's own polyspec/ folder (the app
# layer only) would shadow the staged one: so it runs from inside the staging tree. No cache: it would key
# on the staging paths, and the whole graph takes well under a second anyway.
(cd "$STAGE" && PYTHONPATH=. "$VENV_BIN/lint-imports" --no-cache --no-logo ../../pyproject.toml) || status=1

# mypy reads the same staging tree, for the same reason: it finds polyspec.core and polyspec.router there as
# installed. Its cache lives beside the tree (which is rebuilt each run), so a second run checks only changes.
echo "==> mypy (core, router)"
(cd "$STAGE" && "$VENV_BIN/mypy" --config-file ../../pyproject.toml --cache-dir ../mypy_cache \
  -p polyspec.core -p polyspec.router) || status=1
exit $status
