"""`polyspec deploy k8s`: the example and a registry-backed render pass the Kubernetes schemas offline, and
carry what each deployment needs (speculative config, checksummed artifacts, probes, the registry Secret)."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.k8s.conftest import by_kind, read_manifests, validate

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "drafts"


def _engine_container(deployment: dict) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")


def _spec_config(deployment: dict) -> dict | None:
    args = _engine_container(deployment)["args"]
    return json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else None


def _sums(configmap: dict, which: str) -> dict[str, str]:
    lines = configmap["data"][f"{which}.sha256"].splitlines()
    return {rel: digest for digest, rel in (line.split("  ", 1) for line in lines)}


def test_example_renders_every_part_and_passes_the_schemas(polyspec_cli, verifier, tmp_path: Path) -> None:
    code, stdout, stderr = polyspec_cli("deploy", "k8s", "--example", "--out", str(tmp_path / "out"))
    assert code == 0, stderr
    docs = read_manifests(tmp_path / "out")
    for doc in docs:
        validate(doc)
    kinds = {d["kind"] for d in docs}
    assert kinds == {"Namespace", "Job", "ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler",
                     "PodDisruptionBudget", "ServiceMonitor"}
    manifest = json.loads((SHIPPED / "manifest.json").read_text())["drafts"]
    deployments, configmaps = by_kind(docs, "Deployment"), by_kind(docs, "ConfigMap")
    for entry in manifest:
        name = f"polyspec-{entry['name']}"
        assert name in by_kind(docs, "Service")
        spec = _spec_config(deployments[name])
        assert spec == {"method": "eagle3", "model": "/models/draft", "num_speculative_tokens": 3}
        assert _sums(configmaps[f"{name}-artifacts"], "draft") == entry["checksums"]
        assert _sums(configmaps[f"{name}-artifacts"], "verifier") == verifier.checksums
        pod = deployments[name]["spec"]["template"]["spec"]
        assert [c["name"] for c in pod["initContainers"]] == ["fetch-verifier", "fetch-draft"]
        assert _engine_container(deployments[name])["readinessProbe"]["httpGet"]["path"] == "/health"
    router = deployments["polyspec-router"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in router["env"]}
    assert env["POLYSPEC_REGISTRY_URL"]["valueFrom"]["secretKeyRef"] == {"name": "polyspec-registry", "key": "url"}
    hpa = by_kind(docs, "HorizontalPodAutoscaler")["polyspec-router"]
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]  # request rate only if configured
    notes = (tmp_path / "out" / "NOTES.txt").read_text()
    assert "verifiers/smollm2-135m-instruct/" in notes and "port-forward svc/polyspec-router" in notes


def _router_container(out: Path) -> dict:
    return by_kind(read_manifests(out), "Deployment")["polyspec-router"]["spec"]["template"]["spec"]["containers"][0]


def test_router_pods_need_the_admin_token_unless_the_dashboard_is_off(polyspec_cli, verifier, tmp_path: Path) -> None:
    """A router on the pod's address refuses to mount /admin without a token: the Secret is required, or the
    dashboard is rendered off (`--no-admin`) and no token is read."""
    assert polyspec_cli("deploy", "k8s", "--example", "--out", str(tmp_path / "on"))[0] == 0
    router = _router_container(tmp_path / "on")
    token = {e["name"]: e for e in router["env"]}["POLYSPEC_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token == {"name": "polyspec-admin", "key": "token"}  # not optional: the pod waits for the Secret
    assert "--no-admin" not in router["command"]
    notes = (tmp_path / "on" / "NOTES.txt").read_text()
    assert "create secret generic polyspec-admin" in notes

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"dashboard": {"enabled": False}}))
    code, _, stderr = polyspec_cli("deploy", "k8s", "--example", "--out", str(tmp_path / "off"),
                                   "--values", str(values))
    assert code == 0, stderr
    router = _router_container(tmp_path / "off")
    assert router["command"][-1] == "--no-admin"
    assert "POLYSPEC_ADMIN_TOKEN" not in {e["name"] for e in router["env"]}
    assert "Dashboard: off" in (tmp_path / "off" / "NOTES.txt").read_text()


def test_example_is_deterministic(polyspec_cli, verifier, tmp_path: Path) -> None:
    for out in ("a", "b"):
        assert polyspec_cli("deploy", "k8s", "--example", "--out", str(tmp_path / out))[0] == 0
    for path in sorted((tmp_path / "a").iterdir()):
        assert path.read_text() == (tmp_path / "b" / path.name).read_text(), path.name


@pytest.fixture()
def registry_with_deployments(reg, verifier_rec):
    """The shipped English draft deployed under a name that is no DNS label, and the verifier alone."""
    draft = reg.import_draft(SHIPPED / "smollm2-135m-instruct-en", verifier=verifier_rec.name, name="en-shipped",
                             languages=["en"], status="active")
    reg.deploy(draft.ref, name="EN_General.v2", default=True,
               launch={"k": 5, "max_model_len": 4096, "extra_args": ["--seed", "7"]})
    reg.deploy(None, name="plain-de", languages=["de"], verifier=verifier_rec.name)
    return reg, draft


def test_registry_render_passes_the_schemas(polyspec_cli, registry_with_deployments, registry_url: str,
                                            verifier_rec, tmp_path: Path) -> None:
    from polyspec.k8s.engines import dns_label

    _, draft = registry_with_deployments
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "registry": {"postgres": True}, "dashboard": {"ingress_host": "polyspec.example.org"},
        "router": {"requests_per_second": 40, "config": {"policy": "speed"}},
        "artifacts": {"source": "url", "base_url": "https://bucket.example.org/polyspec"}}))
    code, _, stderr = polyspec_cli("deploy", "k8s", "--out", str(tmp_path / "out"), "--registry", registry_url,
                                   "--values", str(values))
    assert code == 0, stderr
    docs = read_manifests(tmp_path / "out")
    for doc in docs:
        validate(doc)
    deployments = by_kind(docs, "Deployment")
    weird = f"polyspec-{dns_label('EN_General.v2')}"
    assert weird.startswith("polyspec-en-general-v2-") and weird in deployments
    assert deployments[weird]["metadata"]["annotations"]["polyspec.io/deployment"] == "EN_General.v2"
    assert _spec_config(deployments[weird])["num_speculative_tokens"] == 5
    args = _engine_container(deployments[weird])["args"]
    assert args[args.index("--max-model-len") + 1] == "4096" and args[-2:] == ["--seed", "7"]
    assert _sums(by_kind(docs, "ConfigMap")[f"{weird}-artifacts"], "draft") == draft.checksums
    fetch = deployments[weird]["spec"]["template"]["spec"]["initContainers"][1]
    assert fetch["args"][0] == "drafts/en-shipped@1"
    assert fetch["env"] == [{"name": "ARTIFACT_BASE_URL", "value": "https://bucket.example.org/polyspec"}]
    plain = deployments["polyspec-plain-de"]
    assert _spec_config(plain) is None
    assert [c["name"] for c in plain["spec"]["template"]["spec"]["initContainers"]] == ["fetch-verifier"]
    assert {"StatefulSet", "Secret", "Ingress"} <= {d["kind"] for d in docs}
    hpa = by_kind(docs, "HorizontalPodAutoscaler")["polyspec-router"]
    assert hpa["spec"]["metrics"][1]["pods"]["target"]["averageValue"] == "40"
    router_env = {e["name"]: e.get("value") for e in deployments["polyspec-router"]["spec"]["template"]["spec"]
                  ["containers"][0]["env"]}
    assert router_env["POLYSPEC_ROUTER_POLICY"] == "speed"
    assert "polyspec.example.org" in json.loads(router_env["POLYSPEC_ROUTER_ADMIN_ALLOWED_HOSTS"])


def test_the_validator_is_not_vacuous(polyspec_cli, verifier, tmp_path: Path) -> None:
    """A misspelt field or a wrong type fails the same validation the renders pass."""
    assert polyspec_cli("deploy", "k8s", "--example", "--out", str(tmp_path))[0] == 0
    docs = read_manifests(tmp_path)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["interval"] = "often"
    with pytest.raises(Exception, match="often"):
        validate(monitor)


def test_trial_postgres_flag(polyspec_cli, verifier, tmp_path: Path) -> None:
    assert polyspec_cli("deploy", "k8s", "--example", "--postgres", "--out", str(tmp_path))[0] == 0
    docs = read_manifests(tmp_path)
    for doc in docs:
        validate(doc)
    secret = by_kind(docs, "Secret")["polyspec-registry"]
    assert secret["stringData"]["url"].startswith("postgresql+psycopg://polyspec:")
    assert "polyspec-postgres" in by_kind(docs, "StatefulSet") and "polyspec-postgres" in by_kind(docs, "Service")
