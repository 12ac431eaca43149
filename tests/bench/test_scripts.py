"""The lab's scripts/: every script a page, a script or the Makefile names exists, every shell script parses, and
both GPU sequences of the product CLI prepare the device through one step."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"\bscripts/([\w-]+\.(?:py|sh))\b")


def _naming_files() -> list[Path]:
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "Makefile",
            *sorted((ROOT / "scripts").iterdir()), *sorted((ROOT / "bench").glob("*.py"))]


def test_every_script_that_is_named_exists() -> None:
    """A command that docs/, README.md, the Makefile, bench/ or another script names runs a script that is there."""
    missing = sorted({f"{path.relative_to(ROOT)}: scripts/{name}"
                      for path in _naming_files() if path.is_file()
                      for name in NAMED.findall(path.read_text(encoding="utf-8", errors="replace"))
                      if not (ROOT / "scripts" / name).is_file()})
    assert missing == []


def test_the_pattern_finds_what_a_page_names() -> None:
    assert NAMED.findall("run `bash scripts/multilingual_device.sh prep`, then scripts/device_prep.sh.") == \
        ["multilingual_device.sh", "device_prep.sh"]


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.sh")))
def test_every_shell_script_parses(script: str) -> None:
    done = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_the_device_calls_prepare_through_the_shared_step() -> None:
    """Call 1 of both GPU sequences of the product CLI is scripts/device_prep.sh: the wheels, the first half of the
    verifier and the package staged as installed."""
    for name in ("multilingual_device.sh", "multigpu_device.sh"):
        text = (ROOT / "scripts" / name).read_text(encoding="utf-8")
        assert re.search(r"^prep\) bash scripts/device_prep\.sh ;;", text, re.M), name
    prep = (ROOT / "scripts" / "device_prep.sh").read_text(encoding="utf-8")
    assert ".device/m1/part00" in prep and ".device/whl/*.whl" in prep
    assert 'for d in core models registry router training; do ln -s "$PWD/$d" "/tmp/pkg/polyspec/$d"' in prep
