"""The published figures are reproducible: regenerating them from the registry export that docs/ ships
(docs/results/registry.json, every founding draft's evaluations) and the shipped drafts gives exactly the
committed docs/results/acceptance.json and acceptance_tables.md.

So a change to the acceptance arithmetic, to the export format or to the table layout that would change a
published figure fails here, and the fix is to regenerate docs/ (the command is in the failure message),
never to edit a figure by hand. The test asserts no figure itself: the registry export is the source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "results"
REGENERATE = ".venv/bin/python bench/acceptance.py --from-shipped --results docs/results/registry.json"


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory, verifier) -> Path:
    """bench/acceptance.py's output for the shipped drafts plus the committed registry export."""
    out = tmp_path_factory.mktemp("docs-figures")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "acceptance.py"), "--from-shipped",
                           "--results", str(DOCS / "registry.json"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return out


def _key(record: dict) -> tuple:
    return (record["draft"], record.get("benchmark"), record["language"], record["method"], record["k"],
            record.get("subset", "all"))


def test_acceptance_json_matches_the_registry(regenerated: Path) -> None:
    fresh = json.loads((regenerated / "acceptance.json").read_text())
    committed = json.loads((DOCS / "acceptance.json").read_text())
    assert fresh, "the registry export gave no records"
    fresh_by, committed_by = {_key(r): r for r in fresh}, {_key(r): r for r in committed}
    assert len(fresh_by) == len(fresh) and len(committed_by) == len(committed)  # one record per measurement
    hint = f"docs/results/acceptance.json is stale: regenerate it with `{REGENERATE}`"
    assert sorted(fresh_by) == sorted(committed_by), f"{hint} (records added or removed)"
    for key, record in fresh_by.items():
        old = committed_by[key]
        assert set(record) == set(old), f"{hint} (fields of {key})"
        for field, value in record.items():
            if isinstance(value, float) or (isinstance(value, list) and value and isinstance(value[0], float)):
                # Rounded to 4 places when written; a last-digit difference is rounding, not a new figure.
                assert value == pytest.approx(old[field], abs=2e-4), f"{hint} ({key} {field})"
            else:
                assert value == old[field], f"{hint} ({key} {field})"
    assert [_key(r) for r in fresh] == [_key(r) for r in committed], f"{hint} (record order)"


def test_acceptance_tables_match_the_registry(regenerated: Path) -> None:
    fresh = (regenerated / "acceptance_tables.md").read_text()
    assert fresh == (DOCS / "acceptance_tables.md").read_text(), \
        f"docs/results/acceptance_tables.md is stale: regenerate it with `{REGENERATE}`"


def test_acceptance_plot_is_drawn(regenerated: Path) -> None:
    # The PNG is not compared byte for byte (matplotlib and font versions move pixels); that it is drawn
    # from the same records is what the two tests above establish.
    png = regenerated / "acceptance_positions.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_readme_headline_matches_the_registry(regenerated: Path) -> None:
    fresh = (regenerated / "acceptance_headline.md").read_text().strip()
    readme = (ROOT / "README.md").read_text()
    begin = readme.index(fresh.splitlines()[0])
    end = readme.index("<!-- end of headline table -->", begin) + len("<!-- end of headline table -->")
    assert readme[begin:end] == fresh, \
        f"README.md's headline table is stale: regenerate it with `{REGENERATE} --readme README.md`"


def test_multilingual_comparison_matches_its_records(tmp_path: Path) -> None:
    """docs/results.md §14 (the multilingual draft against the specialists) is scripts/multi_report.py's
    rendering of the committed run records and CPU check; a shipped multilingual draft is the one measured."""
    args = ["--multi", "docs/results/quality16d.json", "--specialists", "docs/results/quality16c.json",
            "--cpu", "docs/results/multi_cpu_check.json"]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "multi_report.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() in (ROOT / "docs" / "results.md").read_text(), (
        f"docs/results.md §14 is stale: regenerate it with `python scripts/multi_report.py {' '.join(args)} "
        "--results-md docs/results.md`")
    manifest = json.loads((ROOT / "models" / "drafts" / "manifest.json").read_text())
    multi = [d for d in manifest["drafts"] if d["role"] == "multilingual"]
    assert len(multi) == 1 and multi[0]["provenance"]["run"] == "quality16d"
    run4 = json.loads((DOCS / "quality16d.json").read_text())["records"]
    shipped = {(e["language"], e["subset"]): e["mean_acceptance_length"] for e in multi[0]["evaluations"]}
    measured = {(r["language"], r["subset"]): 1 + sum(r["positions"]) for r in run4 if r["mean_acceptance_length"]}
    assert shipped.keys() == measured.keys() and all(shipped[k] == pytest.approx(measured[k]) for k in shipped)
