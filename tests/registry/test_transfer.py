"""export/import: a registry survives a JSON round trip; conflicting imports write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyspec.registry import ImportFailed, open_registry
from tests.registry.conftest import snapshot


def _populate(reg, base_draft, base_draft_dir: Path) -> None:
    child = reg.import_draft(base_draft_dir, verifier=base_draft.verifier, name="fr-ft", languages=["fr"],
                             parent=base_draft.ref, provenance={"recipe": {"lr": 6e-5}})
    reg.add_evaluation(child.ref, benchmark="mtbench", language="fr", k=3, acceptance=[0.5, 0.3, 0.1])
    reg.promote(child.ref)
    reg.deploy(child.ref, name="fr-1", url="http://127.0.0.1:8001", default=True)
    reg.record_live_stats("r1", [{"language": "fr", "draft_name": child.ref, "requests": 3}])


def test_round_trip(reg, base_draft, base_draft_dir: Path, tmp_path: Path) -> None:
    _populate(reg, base_draft, base_draft_dir)
    data = reg.export_json()
    other = open_registry(f"sqlite:///{tmp_path / 'copy.db'}")
    added = other.import_json(json.loads(json.dumps(data)))
    assert added["drafts"] == 2 and added["evaluations"] == 1 and added["events"] == len(data["events"])
    assert snapshot(other) == snapshot(reg)
    assert other.active_deployments() == reg.active_deployments()
    assert set(other.import_json(data).values()) == {0}  # importing twice adds nothing
    other.close()


def test_conflicting_import_writes_nothing(reg, base_draft, tmp_path: Path) -> None:
    data = reg.export_json()
    data["drafts"][0]["checksums"] = {"model.safetensors": "0" * 64}
    data["evaluations"] = []
    other = open_registry(f"sqlite:///{tmp_path / 'other.db'}")
    other.import_json(reg.export_json())
    before = snapshot(other)
    with pytest.raises(ImportFailed, match="checksums differ"):
        other.import_json(data)
    with pytest.raises(ImportFailed, match="export"):
        other.import_json({"format": "something-else"})
    assert snapshot(other) == before
    other.close()


def test_cli_export_import(cli, reg, base_draft, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "reg.json"
    assert cli("export", str(out)).exit_code == 0
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    res = cli("--url", fresh, "import", str(out), "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["drafts"] == 1
    shown = json.loads(cli("--url", fresh, "show-draft", base_draft.ref, "--json").stdout)
    assert shown["draft"]["checksums"] == base_draft.checksums
    (tmp_path / "junk.json").write_text("[1, 2]")
    assert cli("import", str(tmp_path / "junk.json")).exit_code == 2  # InvalidInput
