"""Importing real speculators drafts: validation, checksums, versions; bad drafts leave the registry unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyspec.registry import InvalidDraft, NotFound
from tests.registry.conftest import snapshot


def test_import_records_checksums_versions_and_provenance(reg, verifier_rec, base_draft_dir: Path) -> None:
    from polyspec.models.checksums import sha256_tree

    first = reg.import_draft(base_draft_dir, verifier=verifier_rec.name, name="en-base", languages="EN,eng",
                             provenance={"recipe": "none"})
    assert (first.version, first.status, first.languages, first.draft_vocab_size) == (1, "candidate", ["en"], 8192)
    assert first.checksums == sha256_tree(base_draft_dir) and "model.safetensors" in first.checksums
    child = reg.import_draft(base_draft_dir, verifier=verifier_rec.name, name="en-base", languages=["en"],
                             parent="en-base@1")
    assert (child.version, child.parent) == (2, "en-base@1")
    assert reg.get_draft("en-base").version == 2 and reg.get_draft("en-base@1").provenance == {"recipe": "none"}
    assert reg.verify_draft("en-base@1") == {"en-base@1": []}
    with pytest.raises(NotFound):
        reg.get_draft("en-base@7")


def test_corrupt_draft_is_refused_and_nothing_written(reg, verifier_rec, draft_copy: Path) -> None:
    before = snapshot(reg)
    weights = draft_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(InvalidDraft):
        reg.import_draft(draft_copy, verifier=verifier_rec.name, name="broken", languages=["en"])
    (draft_copy / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(InvalidDraft, match="speculators|eagle3|Eagle3"):
        reg.import_draft(draft_copy, verifier=verifier_rec.name, name="broken", languages=["en"])
    with pytest.raises(InvalidDraft):
        reg.import_draft(draft_copy / "missing", verifier=verifier_rec.name, name="broken", languages=["en"])
    assert snapshot(reg) == before


def _mismatched_verifier(verifier, tmp_path: Path) -> Path:
    """The bundled verifier with a different vocabulary size: weights linked, config changed."""
    out = tmp_path / "other-verifier"
    out.mkdir()
    for f in Path(verifier.path).iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f)
    cfg = json.loads((Path(verifier.path) / "config.json").read_text())
    cfg["vocab_size"] = cfg["vocab_size"] + 1024
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_verifier_vocabulary_mismatch_is_refused(reg, verifier, base_draft_dir: Path, tmp_path: Path) -> None:
    other = reg.add_verifier(str(_mismatched_verifier(verifier, tmp_path)), name="bigger-vocab")
    before = snapshot(reg)
    with pytest.raises(InvalidDraft, match="vocab|49152"):
        reg.import_draft(base_draft_dir, verifier=other.name, name="en-base", languages=["en"])
    assert snapshot(reg) == before


def test_checksum_drift_is_reported(reg, verifier_rec, draft_copy: Path, cli) -> None:
    rec = reg.import_draft(draft_copy, verifier=verifier_rec.name, name="drifty", languages=["en"])
    assert reg.verify_draft(rec.ref) == {rec.ref: []}
    with open(draft_copy / "config.json", "a", encoding="utf-8") as fh:
        fh.write("\n")
    problems = reg.verify_draft(rec.ref)[rec.ref]
    assert len(problems) == 1 and problems[0].startswith("config.json")
    result = cli("verify", "--json")
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["ok"] is False and payload["drafts"][rec.ref][0].startswith("config.json")


def test_cli_import_and_show(cli, verifier_rec, base_draft_dir: Path, tmp_path: Path) -> None:
    prov = tmp_path / "prov.json"
    prov.write_text(json.dumps({"data": "x", "code_version": "abc"}))
    res = cli("import-draft", str(base_draft_dir), "--name", "cli-draft", "--languages", "en,fr",
              "--verifier", verifier_rec.name, "--provenance", str(prov), "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["languages"] == ["en", "fr"]
    shown = json.loads(cli("show-draft", "cli-draft@1", "--json").stdout)
    assert shown["draft"]["provenance"]["code_version"] == "abc" and shown["evaluations"] == []
    assert "cli-draft@1" in cli("drafts").stdout
    bad = cli("import-draft", str(tmp_path), "--name", "x", "--languages", "en", "--verifier", verifier_rec.name)
    assert bad.exit_code == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
