"""The wheel: one top-level package (`polyspec`), its data files, no draft weights; installed into a
clean venv it imports as `polyspec.*` from anywhere while `import models` fails.

The wheel is built from this tree (pip wheel --no-deps --no-build-isolation, about a second) with
setuptools' build directories redirected to a temporary folder (DIST_EXTRA_CONFIG), so a stale build/
in the checkout can neither leak into it nor be touched. The clean venv is `python -m venv
--without-pip`; its dependencies come from this venv's site-packages through a .pth file, which
Python appends to sys.path without running this venv's own .pth files (the editable install's finder).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The folders that install as polyspec.* (pyproject's [tool.setuptools.package-dir]).
MAPPED = {"polyspec": "polyspec", "core": "polyspec/core", "models": "polyspec/models",
          "registry": "polyspec/registry", "router": "polyspec/router", "training": "polyspec/training"}
DATA_FILES = [
    "polyspec/router/admin/static/admin.css", "polyspec/router/admin/static/admin.js",
    "polyspec/router/admin/templates/dashboard.html", "polyspec/registry/migrations/script.py.mako",
    "polyspec/models/data/en_token_freq.json", "polyspec/registry/data/pt.jsonl", "polyspec/registry/data/th.jsonl",
]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    cfg = work / "setup.cfg"
    cfg.write_text(f"[build]\nbuild_base = {work / 'build'}\n[egg_info]\negg_base = {work}\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist"), "."],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**_clean_env(), "DIST_EXTRA_CONFIG": str(cfg)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = (work / "dist").glob("polyspec-*.whl")
    return built


@pytest.fixture(scope="module")
def names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_one_top_level_package_and_no_weights(wheel, names):
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"polyspec"}, tops
    assert len(tops) == 2
    with zipfile.ZipFile(wheel) as zf:
        top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert zf.read(top_level).decode().split() == ["polyspec"]
    heavy = [n for n in names if n.endswith((".safetensors", ".bin", ".pt", ".gguf")) or "/drafts/" in n]
    assert heavy == []
    assert wheel.stat().st_size < 2 * 1024 * 1024, f"the wheel is {wheel.stat().st_size} bytes"


def test_data_files_are_in(names):
    for path in DATA_FILES:
        assert path in names, path
    mtbench = [n for n in names if n.startswith("polyspec/training/data/mtbench/") and n.endswith(".jsonl")]
    assert {Path(n).stem for n in mtbench} >= {"en", "fr", "de", "es", "ru"}
    assert any(n.startswith("polyspec/registry/migrations/versions/") and n.endswith(".py") for n in names)


def test_every_package_of_the_tree_is_shipped(names):
    """A new sub-package must be added to pyproject's package list; this catches a forgotten one."""
    missing = []
    for folder, installed in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).as_posix()
            target = installed if rel == "." else f"{installed}/{rel}"
            if f"{target}/__init__.py" not in names:
                missing.append(target)
    assert missing == []


def _site_packages(venv: Path) -> Path:
    return venv / Path(sysconfig.get_path("purelib", vars={"base": str(venv)})).relative_to(venv)


@pytest.fixture(scope="module")
def clean_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120,
                   env=_clean_env())
    site = _site_packages(venv)
    assert site.is_dir(), site
    with zipfile.ZipFile(wheel) as zf:  # what pip does with a pure wheel, minus the entry-point scripts
        zf.extractall(site)
    (site / "zz_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    return venv


def _run(venv: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**_clean_env(), "POLYSPEC_HOME": str(cwd / "home")})


def test_installed_wheel_imports_as_polyspec_only(clean_venv, tmp_path):
    proc = _run(clean_venv, "import polyspec.router, polyspec.registry, polyspec.training, polyspec.models, "
                            "polyspec.core; print(polyspec.__file__)", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(_site_packages(clean_venv))
    for name in ("models", "router", "registry", "training", "core"):
        proc = _run(clean_venv, f"import {name}", tmp_path)
        assert proc.returncode != 0 and f"No module named '{name}'" in proc.stderr, (name, proc.stderr)


def test_installed_wheel_finds_drafts_only_after_a_pull(clean_venv, tmp_path):
    """No drafts in the wheel: a clear 'pull it' error, then the draft pulled from a directory mirror."""
    code = (
        "from polyspec.models.shipped import find_draft, SHIPPED_DIR\n"
        "from polyspec.core.errors import NotFoundError\n"
        "from polyspec.models.hub import pull_draft\n"
        "assert not SHIPPED_DIR.exists(), SHIPPED_DIR\n"
        "name = 'smollm2-135m-instruct-fr'\n"
        "try:\n    find_draft(name)\nexcept NotFoundError as exc:\n    print('MISSING', exc)\n"
        f"pull_draft(name, {str(ROOT / 'models' / 'drafts')!r})\n"
        "draft = find_draft(name); draft.verify(); print('FOUND', draft.path)\n"
    )
    proc = _run(clean_venv, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "MISSING" in proc.stdout and "polyspec models pull smollm2-135m-instruct-fr --from" in proc.stdout
    assert f"FOUND {tmp_path / 'home' / 'drafts' / 'smollm2-135m-instruct-fr'}" in proc.stdout


def test_installed_wheel_reads_its_data_files(clean_venv, tmp_path):
    code = ("from importlib.resources import files\n"
            "print(len(files('polyspec.training.data.mtbench').joinpath('fr.jsonl').read_text().splitlines()))\n"
            "print(files('polyspec.router.admin').joinpath('templates/dashboard.html').is_file())\n")
    proc = _run(clean_venv, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["80", "True"]
