"""The lab's scripts/: every script a page, a script or the Makefile names exists, every shell script parses, and
the issue-16 quality blocks of docs/results.md are scripts/quality_report.py's rendering of the committed records."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"\bscripts/([\w-]+\.(?:py|sh))\b")
QUALITY_RUNS = ("quality16", "quality16b", "quality16c", "quality16d")


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


def _quality_report():
    spec = importlib.util.spec_from_file_location("quality_report", ROOT / "scripts" / "quality_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", QUALITY_RUNS)
def test_quality_tables_are_the_rendering_of_the_committed_records(name: str) -> None:
    report = _quality_report()
    data = json.loads((ROOT / "docs" / "results" / f"{name}.json").read_text(encoding="utf-8"))
    tables = "\n".join(report.tables(data["records"], data["run"], data["curves"]))
    committed = (ROOT / "docs" / "results" / f"{name}_tables.md").read_text(encoding="utf-8")
    assert committed.split("\n", 2)[2] == tables + "\n", (
        f"docs/results/{name}_tables.md is stale: regenerate it with "
        f"`python scripts/quality_report.py docs/results/{name}.json --write docs/results`")


@pytest.mark.parametrize("name", QUALITY_RUNS[:3])
def test_quality_blocks_are_the_rendering_of_the_committed_records(name: str) -> None:
    """The block in docs/results.md is the rendering of the committed records, and names a command that reads them."""
    report = _quality_report()
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    begin, end = report.marks(name)
    command = re.search(r"```\n(python scripts/quality_report\.py [^\n]+)\n```", page.split(begin, 1)[1].split(end, 1)[0])
    assert command and command[1] == (f"python scripts/quality_report.py docs/results/{name}.json "
                                      "--write docs/results --results-md docs/results.md")
    data = json.loads((ROOT / "docs" / "results" / f"{name}.json").read_text(encoding="utf-8"))
    records = data["records"]
    drafts = list(dict.fromkeys(r["draft"] for r in records))
    lang_of = {r["draft"]: r.get("target_language", "en") for r in records}
    block = "\n".join(report.section(name, records, data["run"], drafts, lang_of, command[1]))
    assert block in page, f"docs/results.md's {name} block is stale: regenerate it with `{command[1]}`"
