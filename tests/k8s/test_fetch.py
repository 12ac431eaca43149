"""The init containers' fetch-and-check script, run here with sh, sha256sum and curl on the shipped English
draft: it copies (volume) or downloads (object-store URL) every recorded file and fails on a changed one."""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from polyspec.k8s.engines import FETCH_SCRIPT, Artifact

DRAFT = Path(__file__).resolve().parents[2] / "models" / "drafts" / "smollm2-135m-instruct-en"


@pytest.fixture()
def store(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An artifact store holding the draft under its key, the script, and the draft's sha256 list."""
    from polyspec.models.shipped import MANIFEST, checkout_drafts

    entry = next(d for d in checkout_drafts(None, MANIFEST) if d.name == DRAFT.name)
    root = tmp_path / "store"
    shutil.copytree(DRAFT, root / "drafts" / DRAFT.name)
    script, sums = tmp_path / "fetch.sh", tmp_path / "draft.sha256"
    script.write_text(FETCH_SCRIPT)
    sums.write_text(Artifact(f"drafts/{DRAFT.name}", entry.checksums).sums_file())
    return root, script, sums


def _fetch(script: Path, sums: Path, dest: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(script), f"drafts/{DRAFT.name}", str(dest), str(sums)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_volume_copy_is_checked(store, tmp_path: Path) -> None:
    root, script, sums = store
    env = {"PATH": "/usr/bin:/bin", "ARTIFACT_STORE": str(root)}
    done = _fetch(script, sums, tmp_path / "models" / "draft", env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / "draft" / "model.safetensors").read_bytes() == (DRAFT / "model.safetensors").read_bytes()
    with open(root / "drafts" / DRAFT.name / "config.json", "a") as fh:
        fh.write(" ")  # one changed byte
    done = _fetch(script, sums, tmp_path / "again", env)
    assert done.returncode != 0 and "config.json" in done.stdout + done.stderr


def test_download_is_checked(store, tmp_path: Path) -> None:
    root, script, sums = store
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"PATH": "/usr/bin:/bin", "ARTIFACT_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}"}
        done = _fetch(script, sums, tmp_path / "models" / "draft", env)
        assert done.returncode == 0, done.stderr
        (root / "drafts" / DRAFT.name / "config.json").unlink()
        done = _fetch(script, sums, tmp_path / "again", env)
        assert done.returncode != 0  # curl -f: a missing file is an error, not a 404 page saved as the file
    finally:
        server.shutdown()
        server.server_close()
