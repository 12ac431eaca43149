"""`polyspec deploy k8s`, everything but the engines: the router (Deployment, Service, HPA, PDB), the
registry (a Secret the operator provides, or a trial Postgres StatefulSet), the schema Job, the
ServiceMonitor and the dashboard's Ingress. Pure functions of the settings (polyspec.k8s.settings).

The routers are stateless: they read the deployments from the registry and share live statistics through
it, so the HPA may add and remove them freely; the dashboard is each router's own /admin.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from polyspec.k8s.engines import meta, selector
from polyspec.k8s.settings import K8sSettings
from polyspec.router.config import RouterConfig

HOME = "/var/lib/polyspec"  # POLYSPEC_HOME of the router pods (capture, caches): an emptyDir
LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "::1"]  # RouterConfig.admin_allowed_hosts' default, kept with a host


def router_name(settings: K8sSettings) -> str:
    return f"{settings.release}-router"


def _registry_env(settings: K8sSettings) -> dict[str, Any]:
    reg = settings.registry
    return {"name": "POLYSPEC_REGISTRY_URL", "valueFrom": {"secretKeyRef": {"name": reg.secret, "key": reg.secret_key}}}


def _drain_grace_s(settings: K8sSettings) -> float:
    configured = settings.router.config.get("drain_grace_s")
    return float(configured) if configured is not None else float(RouterConfig.model_fields["drain_grace_s"].default)


def router_env(settings: K8sSettings) -> list[dict[str, Any]]:
    """The router's environment: registry URL and admin token from Secrets, its settings as POLYSPEC_ROUTER_*."""
    dash = settings.dashboard
    # A router listening on the pod's address refuses to mount /admin without a token, so the Secret is
    # required (the pod waits for it, saying which) unless the dashboard is off.
    token = [{"name": "POLYSPEC_ADMIN_TOKEN",
              "valueFrom": {"secretKeyRef": {"name": dash.admin_token_secret, "key": "token"}}}] if dash.enabled else []
    env: list[dict[str, Any]] = [
        _registry_env(settings),
        *token,
        {"name": "POLYSPEC_HOME", "value": HOME},
        {"name": "POLYSPEC_ROUTER_ROUTER_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    config = dict(settings.router.config)
    if dash.ingress_host:
        hosts = json.loads(config["admin_allowed_hosts"]) if "admin_allowed_hosts" in config else LOOPBACK_HOSTS
        config["admin_allowed_hosts"] = json.dumps([*hosts, dash.ingress_host])
    env += [{"name": f"POLYSPEC_ROUTER_{key.upper()}", "value": value} for key, value in sorted(config.items())]
    return env


def router_manifests(settings: K8sSettings) -> list[dict[str, Any]]:
    """Deployment, Service, HorizontalPodAutoscaler and PodDisruptionBudget of the router."""
    r, name = settings.router, router_name(settings)
    probe = {"periodSeconds": 5, "timeoutSeconds": 3}
    container = {
        "name": "router", "image": r.image,
        "command": ["polyspec", "serve", "--host", "0.0.0.0", "--port", str(r.port),
                    *([] if settings.dashboard.enabled else ["--no-admin"])],
        "ports": [{"name": "http", "containerPort": r.port}],
        "env": router_env(settings),
        "resources": {"requests": {"cpu": r.cpu, "memory": r.memory}, "limits": {"memory": r.memory}},
        "volumeMounts": [{"name": "home", "mountPath": HOME}],
        # /ready turns 503 on SIGTERM (drain) and while no engine answers; /health only says the process lives.
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "failureThreshold": 2, **probe},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "failureThreshold": 6, **probe},
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(settings, name, "router"),
        "spec": {
            "replicas": r.min_replicas,
            "selector": {"matchLabels": selector(settings, "router")},
            "template": {"metadata": {"labels": meta(settings, name, "router")["labels"]},
                         "spec": {"containers": [container], "volumes": [{"name": "home", "emptyDir": {}}],
                                  # the drain: in-flight requests may finish before SIGKILL
                                  "terminationGracePeriodSeconds": int(_drain_grace_s(settings)) + 15}},
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {**meta(settings, name, "router"),
                     "labels": {**meta(settings, name, "router")["labels"], "polyspec.io/metrics": "true"}},
        "spec": {"selector": selector(settings, "router"), "ports": [{"name": "http", "port": r.port, "targetPort": "http"}]},
    }
    return [deployment, service, _hpa(settings), _pdb(settings)]


def _quantity(value: float) -> str:
    """A Kubernetes quantity for a rate: integers as is, fractions in milli-units (12.5 -> 12500m)."""
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def _hpa(settings: K8sSettings) -> dict[str, Any]:
    r, name = settings.router, router_name(settings)
    metrics: list[dict[str, Any]] = [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": r.target_cpu_percent}}}]
    if r.requests_per_second is not None:
        metrics.append({"type": "Pods", "pods": {"metric": {"name": r.rps_metric}, "target": {
            "type": "AverageValue", "averageValue": _quantity(r.requests_per_second)}}})
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta(settings, name, "router"),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                     "minReplicas": r.min_replicas, "maxReplicas": r.max_replicas, "metrics": metrics}}


def _pdb(settings: K8sSettings) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": meta(settings, router_name(settings), "router"),
            "spec": {"minAvailable": settings.router.min_available,
                     "selector": {"matchLabels": selector(settings, "router")}}}


def registry_manifests(settings: K8sSettings) -> list[dict[str, Any]]:
    """The schema Job (`polyspec registry init`, idempotent) and, for trials, a Postgres with its Secret."""
    out = [_schema_job(settings)]
    if settings.registry.postgres:
        out = _postgres(settings) + out
    return out


def _schema_job(settings: K8sSettings) -> dict[str, Any]:
    name = f"{settings.release}-registry-init"
    container = {"name": "init", "image": settings.router.image, "command": ["polyspec", "registry", "init"],
                 "env": [_registry_env(settings), {"name": "POLYSPEC_HOME", "value": HOME}],
                 "volumeMounts": [{"name": "home", "mountPath": HOME}]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta(settings, name, "registry"),
            "spec": {"backoffLimit": 10, "ttlSecondsAfterFinished": 3600,
                     "template": {"metadata": {"labels": meta(settings, name, "registry")["labels"]},
                                  "spec": {"restartPolicy": "OnFailure", "containers": [container],
                                           "volumes": [{"name": "home", "emptyDir": {}}]}}}}


def _postgres(settings: K8sSettings) -> list[dict[str, Any]]:
    reg, name = settings.registry, f"{settings.release}-postgres"
    host = f"{name}.{settings.namespace}.svc.cluster.local"
    url = f"postgresql+psycopg://polyspec:{quote(reg.postgres_password, safe='')}@{host}:5432/polyspec"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": meta(settings, reg.secret, "registry"),
              "type": "Opaque", "stringData": {reg.secret_key: url, "password": reg.postgres_password}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta(settings, name, "registry"),
               "spec": {"clusterIP": "None", "selector": selector(settings, "registry"),
                        "ports": [{"name": "postgres", "port": 5432, "targetPort": "postgres"}]}}
    container = {
        "name": "postgres", "image": reg.postgres_image, "ports": [{"name": "postgres", "containerPort": 5432}],
        "env": [{"name": "POSTGRES_USER", "value": "polyspec"}, {"name": "POSTGRES_DB", "value": "polyspec"},
                {"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"},
                {"name": "POSTGRES_PASSWORD", "valueFrom": {"secretKeyRef": {"name": reg.secret, "key": "password"}}}],
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
        "readinessProbe": {"exec": {"command": ["pg_isready", "-U", "polyspec"]}, "periodSeconds": 5},
    }
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(settings, name, "registry"),
        "spec": {"serviceName": name, "replicas": 1, "selector": {"matchLabels": selector(settings, "registry")},
                 "template": {"metadata": {"labels": meta(settings, name, "registry")["labels"]},
                              "spec": {"containers": [container]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                     "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": reg.postgres_storage}}}}]},
    }
    return [secret, service, statefulset]


def service_monitor(settings: K8sSettings) -> dict[str, Any]:
    """One ServiceMonitor for every Service labelled polyspec.io/metrics: the router's and the engines'."""
    mon = settings.monitoring
    metadata = meta(settings, settings.release, "monitoring")
    metadata["labels"] = {**metadata["labels"], **mon.labels}
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": metadata,
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/instance": settings.release,
                                                  "polyspec.io/metrics": "true"}},
                     "namespaceSelector": {"matchNames": [settings.namespace]},
                     "endpoints": [{"port": "http", "path": "/metrics", "interval": mon.interval}]}}


def ingress(settings: K8sSettings) -> dict[str, Any]:
    """The router's API and its /admin dashboard under ``dashboard.ingress_host``."""
    dash, name = settings.dashboard, router_name(settings)
    spec: dict[str, Any] = {"rules": [{"host": dash.ingress_host, "http": {"paths": [{
        "path": "/", "pathType": "Prefix",
        "backend": {"service": {"name": name, "port": {"name": "http"}}}}]}}]}
    if dash.ingress_class:
        spec["ingressClassName"] = dash.ingress_class
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta(settings, name, "router"),
            "spec": spec}
