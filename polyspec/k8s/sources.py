"""`polyspec deploy k8s`: where the deployments come from (the registry's active ones, or the shipped drafts
for `--example`), the whole set of manifests, and writing them to a directory.

Layout of the output: one YAML file per part, numbered in the order `kubectl apply -f DIR` should create
them (the namespace first), plus NOTES.txt: the in-cluster URL each registry deployment must point at and
the artifact keys the store must hold.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from polyspec.core.errors import InvalidInput, NotFoundError
from polyspec.core.settings import get_settings
from polyspec.k8s.engines import (
    Artifact, EngineTarget, K8sError, engine_manifests, engine_names, engine_url, fetch_configmap,
)
from polyspec.k8s.grafana import dashboard_configmap
from polyspec.k8s.router import ingress, registry_manifests, router_manifests, router_name, service_monitor
from polyspec.k8s.settings import K8sSettings
from polyspec.models.shipped import MANIFEST, best_for_language, checkout_drafts
from polyspec.models.verifiers import list_prepared

HEADER = "# Rendered by `polyspec deploy k8s`; edit the values, not this file.\n"
NOTES = "NOTES.txt"


class NoDeployments(NotFoundError):
    """The registry has no active deployment: there is nothing to render."""


def _verifier_key(name: str) -> str:
    return f"verifiers/{name}"


def targets_from_registry(reg: Any, where: str) -> list[EngineTarget]:
    """One target per active deployment of ``reg`` (a polyspec.registry.Registry), with recorded checksums."""
    deployments = reg.active_deployments()
    if not deployments:
        raise NoDeployments(f"the registry at {where} has no active deployment, so there is nothing to render",
                            hint="deploy one with `polyspec registry deploy`, or render the example with --example")
    verifiers: dict[str, Artifact] = {}
    targets = []
    for dep in deployments:
        if not dep.verifier_name:
            raise K8sError(f"deployment {dep.name!r} has no verifier in the registry")
        if dep.verifier_name not in verifiers:
            rec = reg.get_verifier(dep.verifier_name)
            verifiers[dep.verifier_name] = Artifact(_verifier_key(rec.name), dict(rec.checksums))
        draft = None
        if dep.draft:
            rec = reg.get_draft(dep.draft)
            draft = Artifact(f"drafts/{rec.name}@{rec.version}", dict(rec.checksums))
        launch = dict(dep.launch or {})
        targets.append(EngineTarget(
            deployment=dep.name, verifier=verifiers[dep.verifier_name], draft=draft, draft_ref=dep.draft,
            k=int(dep.k or 3), languages=list(dep.languages), domain=dep.domain, is_default=dep.is_default,
            max_model_len=launch.get("max_model_len"), served_model_name=launch.get("served_model_name"),
            extra_args=[str(a) for a in launch.get("extra_args") or []]))
    return targets


def targets_from_plan(reg: Any, plan: Any) -> list[EngineTarget]:
    """One target per entry of a plan (registry.fleet_plan.FleetPlan, already checked against ``reg``), with its
    k and its replicas as the Deployment's pods."""
    rec = reg.get_verifier(plan.verifier)
    verifier = Artifact(_verifier_key(rec.name), dict(rec.checksums))
    targets = []
    for entry in plan.entries:
        draft = None
        if entry.draft:
            d = reg.get_draft(entry.draft)
            draft = Artifact(f"drafts/{d.name}@{d.version}", dict(d.checksums))
        targets.append(EngineTarget(
            deployment=entry.name, verifier=verifier, draft=draft, draft_ref=entry.draft, k=entry.k or 3,
            languages=list(entry.languages), is_default=entry.default, replicas=entry.replicas))
    return targets


def targets_from_shipped(manifest: Path | None = None) -> list[EngineTarget]:
    """The example: one target per draft of models/drafts/manifest.json (weights not needed, only their
    sha256), the verifier's sha256 from its prepared copy (`polyspec models prepare`)."""
    drafts = checkout_drafts(None, manifest or MANIFEST)
    if not drafts:
        raise NoDeployments(f"no shipped drafts listed in {manifest or MANIFEST} (a source checkout has them)")
    prepared = {v.name: v for v in list_prepared()}
    default_draft = best_for_language(drafts, get_settings().default_language)  # by measured acceptance
    targets = []
    for draft in drafts:
        verifier = prepared.get(draft.verifier)
        if verifier is None or not verifier.checksums:
            raise K8sError(f"the sha256 of verifier {draft.verifier!r} are unknown here",
                           hint=f"prepare it once with `polyspec models prepare {draft.verifier}`")
        k = int(next((e.get("k") for e in draft.evaluations if e.get("k")), 3))
        targets.append(EngineTarget(
            deployment=draft.name, verifier=Artifact(_verifier_key(verifier.name), dict(verifier.checksums)),
            draft=Artifact(f"drafts/{draft.name}", dict(draft.checksums)), draft_ref=draft.name, k=k,
            languages=list(draft.languages), is_default=draft is default_draft))
    return targets


def render(targets: list[EngineTarget], settings: K8sSettings, plan: Any = None) -> dict[str, list[dict[str, Any]]]:
    """File name -> the manifests it holds, for every part of the installation (``plan``: the fleet plan the
    targets come from, shown on the Grafana dashboard)."""
    names = engine_names(targets, settings)
    files: dict[str, list[dict[str, Any]]] = {
        "00-namespace.yaml": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": settings.namespace}}],
        "10-registry.yaml": registry_manifests(settings),
        "20-engines.yaml": [fetch_configmap(settings)],
    }
    for target in targets:
        files["20-engines.yaml"] += engine_manifests(target, names[target.deployment], settings)
    files["30-router.yaml"] = router_manifests(settings)
    files["40-monitoring.yaml"] = [service_monitor(settings)] if settings.monitoring.service_monitor else []
    files["40-monitoring.yaml"].append(dashboard_configmap(settings, plan))
    if settings.dashboard.ingress_host:
        files["50-dashboard.yaml"] = [ingress(settings)]
    return files


def notes(targets: list[EngineTarget], settings: K8sSettings) -> str:
    """What the operator does besides `kubectl apply`: artifacts to upload, engine URLs to register."""
    names = engine_names(targets, settings)
    store = (f"PVC {settings.artifacts.volume_claim}" if settings.artifacts.source == "volume"
             else settings.artifacts.base_url)
    keys = sorted({t.verifier.key for t in targets} | {t.draft.key for t in targets if t.draft})
    lines = [f"polyspec on Kubernetes: namespace {settings.namespace}, release {settings.release}.", "",
             f"1. The artifact store ({store}) must hold these directories (files as recorded, sha256-checked):",
             *[f"   {key}/" for key in keys], "",
             f"2. The registry URL is read from Secret {settings.registry.secret} (key {settings.registry.secret_key})"
             + (" (rendered: trial Postgres)." if settings.registry.postgres else "; create it first."), "",
             "3. Each registry deployment must point at its engine's Service (the router routes by these URLs):"]
    for target in targets:
        url = engine_url(names[target.deployment], settings)
        lines.append(f"   {target.deployment}: {url}")
    dash = settings.dashboard
    if dash.enabled:
        lines += ["", f"4. Dashboard: the routers start once Secret {dash.admin_token_secret} (key token) exists: "
                  f"kubectl -n {settings.namespace} create secret generic {dash.admin_token_secret} "
                  "--from-literal=token=$(openssl rand -hex 32)",
                  f"   Then kubectl -n {settings.namespace} port-forward svc/{router_name(settings)} "
                  f"{settings.router.port} and open http://localhost:{settings.router.port}/admin"
                  + (f", or https://{dash.ingress_host}/admin," if dash.ingress_host else "")
                  + " with that token."]
    else:
        lines += ["", "4. Dashboard: off (dashboard.enabled is false; the routers run with --no-admin)."]
    return "\n".join(lines) + "\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the fetch script, checksum lists) as literal blocks, so a reviewer can read them."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def to_yaml(docs: list[dict[str, Any]]) -> str:
    return HEADER + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


def check_out(out: Path) -> Path:
    """``out`` if it is, or can be made, a writable directory; else InvalidInput saying why. Run before the
    registry is read, so a bad --out fails first and fast."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InvalidInput(f"--out {out} is a file, not a directory")
    parent = next((p for p in (out, *out.parents) if p.exists()), Path("/"))
    if not parent.is_dir():
        raise InvalidInput(f"--out {out}: cannot create the directory ({parent} is a file)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidInput(f"--out {out} is not writable" + ("" if parent == out else f" ({parent} is not)"))
    return out


def write(out: Path, files: dict[str, list[dict[str, Any]]], notes_text: str) -> list[Path]:
    """Write the files into ``out`` (created if missing); files an earlier render wrote and this one did not
    (an undeployed engine's) are removed, so `kubectl apply -f` never re-creates them. Clear errors when
    ``out`` is a file or cannot be written."""
    out = check_out(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"--out {out}: cannot create the directory ({exc.strerror or exc})") from None
    written = []
    try:
        for stale in sorted(out.glob("*.yaml")):
            if stale.name not in files and stale.read_text(errors="replace").startswith(HEADER):
                stale.unlink()
        for name, docs in files.items():
            (out / name).write_text(to_yaml(docs), encoding="utf-8")
            written.append(out / name)
        (out / NOTES).write_text(notes_text, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    return [*written, out / NOTES]
