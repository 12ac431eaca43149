"""The settings model of `polyspec deploy k8s` is the single source of truth: every field changes the
rendered manifests, the docs table is generated from it, and bad values or hostile inputs fail clearly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from polyspec.k8s.engines import Artifact, EngineTarget, K8sError, dns_label, engine_names
from polyspec.k8s.settings import K8sSettings, K8sValuesError, leaf_fields, load_values, settings_table
from polyspec.k8s.sources import render, to_yaml, write

ROOT = Path(__file__).resolve().parents[2]
SUM = "0" * 64

# A value other than the default for every setting, and the other settings it only takes effect with
# (an ingress class needs an ingress). A new setting without a probe here fails the coverage test.
PROBES: dict[str, Any] = {
    "release": "ps", "namespace": "serving", "labels": {"team": "ml"},
    "engine.image": "registry.local/vllm:1", "engine.port": 8080, "engine.replicas": 2, "engine.dtype": "float16",
    "engine.gpus": 2, "engine.gpu_resource": "amd.com/gpu", "engine.cpu": "8", "engine.memory": "48Gi",
    "engine.shm_size": "8Gi", "engine.max_model_len": 8192, "engine.enforce_eager": True,
    "engine.extra_args": ["--seed", "1"], "engine.probe_period_s": 20, "engine.startup_timeout_s": 600,
    "engine.node_selector": {"gpu": "h200"},
    "artifacts.source": "url", "artifacts.volume_claim": "models-pvc", "artifacts.base_url": "https://b.example/p2",
    "artifacts.fetch_image": "alpine/curl:1", "artifacts.cache_size": "80Gi",
    "router.image": "registry.local/polyspec:2", "router.port": 9000, "router.min_replicas": 3,
    "router.max_replicas": 20, "router.target_cpu_percent": 50, "router.requests_per_second": 12.5,
    "router.rps_metric": "router_rps", "router.min_available": 2, "router.cpu": "2", "router.memory": "2Gi",
    "router.config": {"policy": "speed"},
    "registry.secret": "pg-url", "registry.secret_key": "dsn", "registry.postgres": True,
    "registry.postgres_image": "postgres:16", "registry.postgres_storage": "50Gi",
    "registry.postgres_password": "another-secret",
    "monitoring.service_monitor": False, "monitoring.interval": "15s", "monitoring.labels": {"release": "prom"},
    "dashboard.enabled": False, "dashboard.admin_token_secret": "admin-tok", "dashboard.ingress_host": "ps.example.org",
    "dashboard.ingress_class": "nginx",
}
NEEDS: dict[str, dict[str, Any]] = {
    "artifacts.base_url": {"artifacts.source": "url", "artifacts.base_url": "https://b.example/p1"},
    "artifacts.source": {"artifacts.base_url": "https://b.example/p1"},
    "artifacts.volume_claim": {}, "router.rps_metric": {"router.requests_per_second": 10},
    "router.min_available": {"router.min_replicas": 4},
    "registry.postgres_image": {"registry.postgres": True}, "registry.postgres_storage": {"registry.postgres": True},
    "registry.postgres_password": {"registry.postgres": True},
    "dashboard.ingress_class": {"dashboard.ingress_host": "ps.example.org"},
}


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _targets() -> list[EngineTarget]:
    verifier = Artifact("verifiers/v", {"config.json": SUM})
    return [EngineTarget("en", verifier, Artifact("drafts/en@1", {"model.safetensors": SUM}), "en@1", 3, ["en"]),
            EngineTarget("plain", verifier, None, None, 0, ["de"])]


def _rendered(flat: dict[str, Any]) -> str:
    files = render(_targets(), K8sSettings.model_validate(_nest(flat)))
    return "".join(f"{name}\n{to_yaml(docs)}" for name, docs in sorted(files.items()))


def test_every_setting_has_a_probe() -> None:
    assert sorted(PROBES) == sorted(name for name, _ in leaf_fields())


@pytest.mark.parametrize("name", sorted(PROBES))
def test_every_setting_reaches_the_manifests(name: str) -> None:
    base = dict(NEEDS.get(name, {}))
    assert _rendered({**base, name: PROBES[name]}) != _rendered(base), f"{name} changes no manifest"


def test_docs_table_is_generated_from_the_model() -> None:
    docs = (ROOT / "docs" / "scale-out.md").read_text()
    assert settings_table() in docs, ("docs/scale-out.md's settings table is stale: regenerate it with "
                                      "`polyspec deploy k8s --settings-table`")


def test_dns_labels_are_deterministic_and_valid() -> None:
    assert dns_label("en-general") == "en-general"  # already a label: kept as is
    cases = ["EN_General", "en.general", "en_general", "1st", "___", "ü" * 80, "a" * 100, "Fr--Draft@2"]
    labels = [dns_label(case) for case in cases]
    assert labels == [dns_label(case) for case in cases]
    assert len(set(labels)) == len(labels), "distinct names must stay distinct"
    for label in labels:
        assert len(label) <= 63 and label[0].isalpha() and label.replace("-", "").isalnum() and label == label.lower()
    settings = K8sSettings()
    long_names = engine_names([EngineTarget("x" * 200, _targets()[0].verifier, None, None, 0)], settings)
    assert len(long_names["x" * 200]) <= 63


def test_unsafe_artifact_files_are_refused() -> None:
    for rel in ("../etc/passwd", "/abs", "a b", "x;rm -rf /", "ok\nfile"):
        with pytest.raises(K8sError, match="safe relative path"):
            Artifact("drafts/x", {rel: SUM}).sums_file()
    with pytest.raises(K8sError, match="no valid sha256"):
        Artifact("drafts/x", {"config.json": "abc"}).sums_file()
    with pytest.raises(K8sError, match="no recorded sha256"):
        Artifact("drafts/x", {}).sums_file()


def test_bad_values_name_the_field(tmp_path: Path) -> None:
    cases = {"engine: {dtype: auto}": "engine.dtype", "router: {cpu: lots}": "router.cpu",
             "release: Bad_Name": "release", "artifacts: {source: url}": "artifacts",
             "router: {config: {no_such_knob: '1'}}": "router.config", "engine: {gpuz: 1}": "engine.gpuz",
             "router: {config: {registry_url: x}}": "router.config"}
    for text, field in cases.items():
        path = tmp_path / "values.yaml"
        path.write_text(text)
        with pytest.raises(K8sValuesError, match=field.replace(".", r"\.")):
            load_values(path)
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(K8sValuesError, match="mapping"):
        load_values(tmp_path / "list.yaml")


def test_out_that_is_a_file_or_not_writable_fails_clearly(polyspec_cli, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, message in ((afile, "is a file"), (afile / "sub", "cannot create"),
                         (Path("/proc/polyspec-k8s-test"), "cannot create")):
        with pytest.raises(Exception, match=message):
            write(out, {"a.yaml": []}, "")
    code, _, stderr = polyspec_cli("deploy", "k8s", "--out", str(afile), "--registry", f"sqlite:///{tmp_path}/r.db")
    assert code == 2 and "is a file" in stderr
    if os.geteuid() != 0:  # root writes anywhere; the /proc case above covers it there
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(Exception, match="not writable"):
            write(locked, {"a.yaml": []}, "")


def test_an_empty_registry_says_so(polyspec_cli, reg, registry_url: str, tmp_path: Path) -> None:
    code, stdout, stderr = polyspec_cli("deploy", "k8s", "--out", str(tmp_path / "out"), "--registry", registry_url)
    assert code == 3 and "no active deployment" in stderr and "--example" in stderr
    assert not (tmp_path / "out").exists()


def test_a_rerender_removes_parts_no_longer_rendered(tmp_path: Path) -> None:
    with_ingress = K8sSettings.model_validate({"dashboard": {"ingress_host": "ps.example.org"}})
    write(tmp_path, render(_targets(), with_ingress), "")
    assert (tmp_path / "50-dashboard.yaml").is_file()
    (tmp_path / "mine.yaml").write_text("kind: ConfigMap\n")  # not ours: kept
    write(tmp_path, render(_targets(), K8sSettings()), "")
    assert not (tmp_path / "50-dashboard.yaml").exists() and (tmp_path / "mine.yaml").is_file()


def test_example_without_a_prepared_verifier_says_how_to_get_one(polyspec_cli, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from polyspec.core.settings import reset_settings_cache

    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "empty-home"))
    reset_settings_cache()
    try:
        code, _, stderr = polyspec_cli("deploy", "k8s", "--example", "--out", str(tmp_path / "out"))
    finally:
        monkeypatch.undo()
        reset_settings_cache()
    assert code == 2 and "polyspec models prepare smollm2-135m-instruct" in stderr
    assert not (tmp_path / "out").exists()
