"""docs/languages.md's add-language tables are the command's output: what add-language says for every bundled
language on a fresh registry of the shipped drafts, and the leave-one-out check of its predictions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_languages_page_matches_add_language(verifier) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "language_table.py"), "--check"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
