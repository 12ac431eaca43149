"""`polyspec deploy k8s`, the engines: pure functions from the deployments to serve (:class:`EngineTarget`)
and the settings (polyspec.k8s.settings) to Kubernetes manifests as dicts. Nothing here reads the registry,
the environment or the disk (polyspec.k8s.sources does), so the same inputs always give the same output.

Per deployment: a ConfigMap with the sha256 of every verifier and draft file, a Deployment whose init
containers fetch those files (from a volume or an object-store URL) and check every sha256 before vLLM
starts, and a Service. The `vllm serve` arguments, speculative config included, come from
models.vllm_engine.EngineSpec: the one place that builds an engine's command line.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from polyspec.core.errors import InvalidInput
from polyspec.k8s.settings import DNS_LABEL, K8sSettings
from polyspec.models.vllm_engine import EngineSpec

MODELS_DIR = "/models"  # the emptyDir the init containers fill and vLLM reads
STORE_DIR = "/artifacts"  # the artifact volume (source: volume)
FETCH_SCRIPT = """\
#!/bin/sh
# fetch.sh KEY DEST SUMS: copy (volume) or download (url) every file SUMS lists from KEY into DEST, then check
# each one's sha256; any missing or changed file fails the init container, so vLLM never starts on it.
set -eu
key=$1; dest=$2; sums=$3
mkdir -p "$dest"
while read -r sum file; do
  [ -n "$file" ] || continue
  mkdir -p "$dest/$(dirname "$file")"
  if [ -n "${ARTIFACT_BASE_URL:-}" ]; then
    curl -fsSL --retry 5 -o "$dest/$file" "$ARTIFACT_BASE_URL/$key/$file"
  else
    cp "${ARTIFACT_STORE:-%s}/$key/$file" "$dest/$file"
  fi
done < "$sums"
cd "$dest" && sha256sum -c "$sums"
""" % STORE_DIR
# A file of an artifact, as a path relative to its directory: plain segments only (no "..", no spaces, no
# shell or URL metacharacters), since it is spliced into a download URL and a copy command.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*(/[A-Za-z0-9_][A-Za-z0-9._+-]*)*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class K8sError(InvalidInput):
    """The deployments cannot be rendered as given (a name collision, an artifact without checksums, ...)."""


@dataclass(frozen=True)
class Artifact:
    """A model directory in the artifact store: ``key`` is its path there, ``checksums`` its files' sha256."""

    key: str
    checksums: dict[str, str]

    def sums_file(self) -> str:
        """``sha256sum -c`` input; refuses a path or digest that could not be fetched safely."""
        if not self.checksums:
            raise K8sError(f"artifact {self.key} has no recorded sha256: nothing to check its files against")
        for rel, digest in self.checksums.items():
            if not _SAFE_PATH.fullmatch(rel) or ".." in PurePosixPath(rel).parts:
                raise K8sError(f"artifact {self.key}: file name {rel!r} is not a safe relative path")
            if not _SHA256.fullmatch(digest):
                raise K8sError(f"artifact {self.key}: {rel} has no valid sha256 ({digest!r})")
        return "".join(f"{digest}  {rel}\n" for rel, digest in sorted(self.checksums.items()))


@dataclass(frozen=True)
class EngineTarget:
    """One deployment to serve: what polyspec.k8s.sources reads from the registry or the shipped drafts."""

    deployment: str  # the registry's name, as is (maybe not a DNS label)
    verifier: Artifact
    draft: Artifact | None
    draft_ref: str | None  # "name@version", or the shipped draft's name
    k: int
    languages: list[str] = field(default_factory=list)
    domain: str = "general"
    is_default: bool = False
    max_model_len: int | None = None
    served_model_name: str | None = None
    extra_args: list[str] = field(default_factory=list)
    replicas: int | None = None  # pods of this deployment (a plan's replicas); None: the settings' engine.replicas


def dns_label(name: str, *, room: int = 63) -> str:
    """``name`` as an RFC 1035 label of at most ``room`` characters, deterministically: lower-cased, runs
    of other characters turned into '-'; when that changed anything, 8 hex digits of the original's sha256
    are appended, so 'EN_general' and 'en.general' never end up with the same name."""
    clean = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if clean and not clean[0].isalpha():
        clean = "d-" + clean
    if clean == name and len(clean) <= room:
        return clean
    tag = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    head = clean[: room - len(tag) - 1].rstrip("-") or "d"
    return f"{head}-{tag}"


def engine_names(targets: list[EngineTarget], settings: K8sSettings) -> dict[str, str]:
    """Deployment name -> object name (``RELEASE-NAME``); refuses two deployments mapped to one name."""
    prefix = f"{settings.release}-"
    names = {t.deployment: prefix + dns_label(t.deployment, room=63 - len(prefix)) for t in targets}
    seen: dict[str, str] = {}
    for deployment, name in names.items():
        if name in seen:
            raise K8sError(f"deployments {seen[name]!r} and {deployment!r} both render as {name!r}; rename one")
        if not DNS_LABEL.fullmatch(name):
            raise K8sError(f"deployment {deployment!r} gives {name!r}, not a DNS label")
        seen[name] = deployment
    return names


def labels(settings: K8sSettings, component: str, **extra: str) -> dict[str, str]:
    return {**settings.labels, "app.kubernetes.io/name": "polyspec", "app.kubernetes.io/instance": settings.release,
            "app.kubernetes.io/component": component, "app.kubernetes.io/managed-by": "polyspec", **extra}


def selector(settings: K8sSettings, component: str, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": settings.release, "app.kubernetes.io/component": component, **extra}


def meta(settings: K8sSettings, name: str, component: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": settings.namespace, "labels": labels(settings, component), **extra}


def vllm_args(target: EngineTarget, settings: K8sSettings) -> list[str]:
    """The `vllm serve` arguments of ``target``, from models.vllm_engine.EngineSpec (the speculative config's
    only home), without what this machine's settings add."""
    eng = settings.engine
    extra = [*eng.extra_args, *target.extra_args] + (["--enforce-eager"] if eng.enforce_eager else [])
    max_len = eng.max_model_len or target.max_model_len
    knobs = {"max_model_len": max_len} if max_len else {}
    if target.draft is not None:  # k means nothing without a draft (a plain deployment has none)
        knobs.update(draft=Path(f"{MODELS_DIR}/draft"), k=target.k)
    spec = EngineSpec(verifier=Path(f"{MODELS_DIR}/verifier"), host="0.0.0.0", port=eng.port, dtype=eng.dtype,
                      served_model_name=target.served_model_name, extra_args=extra, **knobs)
    return spec.serve_args(eng.port, this_host=False)  # the image's `vllm serve` takes the same arguments


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": 5}


def _fetch_container(settings: K8sSettings, which: str, artifact: Artifact) -> dict[str, Any]:
    art = settings.artifacts
    mounts = [{"name": "fetch", "mountPath": "/polyspec"}, {"name": "sums", "mountPath": "/sums"},
              {"name": "models", "mountPath": MODELS_DIR}]
    if art.source == "volume":
        mounts.append({"name": "store", "mountPath": STORE_DIR, "readOnly": True})
    return {
        "name": f"fetch-{which}", "image": art.fetch_image, "command": ["sh", "/polyspec/fetch.sh"],
        "args": [artifact.key, f"{MODELS_DIR}/{which}", f"/sums/{which}.sha256"],
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False},
        **({"env": [{"name": "ARTIFACT_BASE_URL", "value": (art.base_url or "").rstrip("/")}]}
           if art.source == "url" else {}),
    }


def fetch_configmap(settings: K8sSettings) -> dict[str, Any]:
    """The fetch-and-check script every engine's init containers run."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(settings, f"{settings.release}-fetch", "engine"),
            "data": {"fetch.sh": FETCH_SCRIPT}}


def engine_manifests(target: EngineTarget, name: str, settings: K8sSettings) -> list[dict[str, Any]]:
    """ConfigMap (checksums), Deployment and Service of one deployment's engine."""
    eng, art = settings.engine, settings.artifacts
    sums = {"verifier.sha256": target.verifier.sums_file()}
    if target.draft is not None:
        sums["draft.sha256"] = target.draft.sums_file()
    digest = hashlib.sha256(json.dumps(sums, sort_keys=True).encode()).hexdigest()
    notes = {"polyspec.io/deployment": target.deployment, "polyspec.io/draft": target.draft_ref or "none",
             "polyspec.io/languages": ",".join(target.languages) or "default", "polyspec.io/domain": target.domain,
             "polyspec.io/default": str(target.is_default).lower()}
    pod_labels = labels(settings, "engine", **{"polyspec.io/engine": name})
    resources: dict[str, Any] = {"requests": {"cpu": eng.cpu, "memory": eng.memory}, "limits": {"memory": eng.memory}}
    if eng.gpus:
        resources["requests"][eng.gpu_resource] = eng.gpus
        resources["limits"][eng.gpu_resource] = eng.gpus
    volumes: list[dict[str, Any]] = [
        {"name": "fetch", "configMap": {"name": f"{settings.release}-fetch"}},
        {"name": "sums", "configMap": {"name": f"{name}-artifacts"}},
        {"name": "models", "emptyDir": {"sizeLimit": art.cache_size}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": eng.shm_size}},
    ]
    if art.source == "volume":
        volumes.append({"name": "store", "persistentVolumeClaim": {"claimName": art.volume_claim, "readOnly": True}})
    init = [_fetch_container(settings, "verifier", target.verifier)]
    if target.draft is not None:
        init.append(_fetch_container(settings, "draft", target.draft))
    period = eng.probe_period_s
    container = {
        "name": "vllm", "image": eng.image, "command": ["vllm", "serve"], "args": vllm_args(target, settings),
        "ports": [{"name": "http", "containerPort": eng.port}],
        "env": [{"name": "VLLM_NO_USAGE_STATS", "value": "1"}, {"name": "DO_NOT_TRACK", "value": "1"}],
        "resources": resources,
        "volumeMounts": [{"name": "models", "mountPath": MODELS_DIR, "readOnly": True},
                         {"name": "shm", "mountPath": "/dev/shm"}],
        "startupProbe": _probe("/health", period, max(1, -(-eng.startup_timeout_s // period))),
        "readinessProbe": _probe("/health", period, 3),
        "livenessProbe": _probe("/health", period, 6),
    }
    pod_spec: dict[str, Any] = {"initContainers": init, "containers": [container], "volumes": volumes}
    if eng.node_selector:
        pod_spec["nodeSelector"] = dict(eng.node_selector)
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(settings, name, "engine", annotations=notes),
        "spec": {
            "replicas": target.replicas or eng.replicas,
            "selector": {"matchLabels": selector(settings, "engine", **{"polyspec.io/engine": name})},
            "template": {"metadata": {"labels": pod_labels,
                                      "annotations": {**notes, "polyspec.io/artifacts-sha256": digest}},
                         "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {**meta(settings, name, "engine", annotations=notes),
                     "labels": labels(settings, "engine", **{"polyspec.io/metrics": "true"})},
        "spec": {"selector": selector(settings, "engine", **{"polyspec.io/engine": name}),
                 "ports": [{"name": "http", "port": eng.port, "targetPort": "http"}]},
    }
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(settings, f"{name}-artifacts", "engine"),
                 "data": sums}
    return [configmap, deployment, service]


def engine_url(name: str, settings: K8sSettings) -> str:
    """The in-cluster URL of an engine's Service: what the registry's deployment must point at."""
    return f"http://{name}.{settings.namespace}.svc.cluster.local:{settings.engine.port}"

