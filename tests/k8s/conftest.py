"""Helpers of the `polyspec deploy k8s` tests: run the command in-process, read what it wrote, and validate
every manifest offline against the Kubernetes schemas that kubernetes-validate ships (pinned version)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.registry.conftest import reg, verifier_rec  # noqa: F401 - the registry tests' own fixtures

# The Kubernetes release whose schemas the manifests must pass (kubernetes-validate 1.37.0 ships 1.26 to 1.37;
# 1.33 is an older release still in support, so the manifests use no API newer than what most clusters run).
KUBERNETES_VERSION = "1.33.0"

# ServiceMonitor is a CustomResourceDefinition of the Prometheus Operator: kubernetes-validate has no schema
# for it (it raises SchemaNotFoundError), so its shape is checked here against the fields of
# monitoring.coreos.com/v1 that the renderer writes, no more and no fewer.
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"], "properties": {
            "name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$"},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "endpoints"], "properties": {
            "selector": {"type": "object", "additionalProperties": False, "required": ["matchLabels"], "properties": {
                "matchLabels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}}}},
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "matchNames": {"type": "array", "items": {"type": "string"}}}},
            "endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "required": ["port", "path"], "properties": {
                    "port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
                    "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}}}}}},
    },
}


def validate(doc: dict[str, Any]) -> None:
    """Raise unless ``doc`` passes its schema (strict: unknown fields are errors, as typos would be)."""
    if doc.get("apiVersion") == "monitoring.coreos.com/v1":
        jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def read_manifests(out: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(out.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.fixture()
def polyspec_cli():
    """`polyspec ARGS...` in-process: (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from polyspec.cli import app

    runner = CliRunner()

    def run(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, result.stdout, result.stderr

    return run
