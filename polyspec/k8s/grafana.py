"""`polyspec deploy k8s`, the Grafana dashboard: a ConfigMap holding a dashboard JSON over the router's
Prometheus metrics (router/telemetry.py), labelled for Grafana's dashboard sidecar (``grafana_dashboard: "1"``,
as kube-prometheus-stack and vLLM's production-stack load theirs).

Panels: mean acceptance length per language, observed tokens/s per language, predicted against observed
tokens/s per language, the speed policy's decisions per engine (draft) and reason, requests and health per
engine replica, and, with `--plan`, the plan's per-cell predictions as a table to read the live figures against.
Pure: the same inputs give the same JSON.
"""

from __future__ import annotations

import json
from typing import Any

from polyspec.k8s.engines import meta
from polyspec.k8s.settings import K8sSettings

WINDOW = "5m"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _ts(panel_id: int, title: str, targets: list[tuple[str, str]], unit: str, y: int, x: int = 0,
        width: int = 12, description: str = "") -> dict[str, Any]:
    return {
        "id": panel_id, "type": "timeseries", "title": title, "description": description, "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}
                    for i, (expr, legend) in enumerate(targets)],
    }


def queries() -> list[tuple[str, list[tuple[str, str]], str, str]]:
    """(title, [(PromQL, legend)], unit, description) of every metric panel, in order."""
    w = WINDOW
    observed = (f"sum by (language) (rate(polyspec_request_tokens_per_second_sum[{w}])) / "
                f"sum by (language) (rate(polyspec_request_tokens_per_second_count[{w}]))")
    return [
        ("Mean acceptance length per language",
         [(f"1 + sum by (language) (rate(polyspec_spec_accepted_tokens_total[{w}])) / "
           f"sum by (language) (rate(polyspec_spec_steps_total[{w}]))", "{{language}}")],
         "none", "Tokens per verify step (1 + accepted drafts per step), over all drafts."),
        ("Acceptance rate per language and draft",
         [(f"sum by (language, draft) (rate(polyspec_spec_accepted_tokens_total[{w}])) / "
           f"sum by (language, draft) (rate(polyspec_spec_draft_tokens_total[{w}]))", "{{language}} / {{draft}}")],
         "percentunit", "Accepted over proposed draft tokens."),
        ("Observed tokens/s per language", [(observed, "{{language}}")], "none",
         "Mean of answered requests' completion tokens over engine wall time."),
        ("Predicted against observed tokens/s per language",
         [("avg by (language) (polyspec_predicted_tokens_per_second)", "predicted {{language}}"),
          (observed, "observed {{language}}")], "none",
         "The speed model's latest prediction beside what requests got (docs/speed.md)."),
        ("Decisions per engine (draft) and reason",
         [(f"sum by (draft, reason) (rate(polyspec_route_choices_total[{w}]))", "{{draft}} {{reason}}")], "reqps",
         "Answered requests by the draft that answered and why its pool answered."),
        ("Requests per engine replica",
         [(f"sum by (backend) (rate(polyspec_requests_total[{w}]))", "{{backend}}"),
          ("sum by (backend) (polyspec_backend_in_flight)", "in flight {{backend}}")], "reqps", ""),
        ("Engine replicas healthy", [("polyspec_backend_up", "{{backend}}")], "none", "1 while healthy."),
    ]


def plan_markdown(plan: Any) -> str:
    """The plan (registry.fleet_plan.FleetPlan) as a Markdown table for a text panel."""
    lines = [f"**Plan**: {plan.engines_used} engine(s) for verifier `{plan.verifier}`, traffic-weighted "
             f"{plan.weighted_tps:.1f} tok/s predicted, {plan.speedup:.2f}x no speculation.", "",
             "| language | domain | share | engine | predicted tok/s | no speculation | speed-up |",
             "|---|---|---:|---|---:|---:|---:|"]
    lines += [f"| {p.language} | {p.domain} | {p.share:.0%} | {p.entry} | {p.tps:.1f} | {p.plain_tps:.1f} | "
              f"{p.speedup:.2f}x |" for p in plan.predicted]
    return "\n".join(lines)


def dashboard(settings: K8sSettings, plan: Any = None) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    if plan is not None:
        panels.append({"id": 1, "type": "text", "title": "Fleet plan (polyspec deploy plan)",
                       "gridPos": {"h": 3 + len(plan.predicted), "w": 24, "x": 0, "y": 0},
                       "options": {"mode": "markdown", "content": plan_markdown(plan)}})
        y = 3 + len(plan.predicted)
    for i, (title, targets, unit, description) in enumerate(queries()):
        panels.append(_ts(10 + i, title, targets, unit, y + (i // 2) * 8, x=(i % 2) * 12, description=description))
    return {
        "uid": f"polyspec-{settings.release}"[:40], "title": f"polyspec ({settings.release})", "schemaVersion": 39,
        "tags": ["polyspec", "speculative-decoding"], "timezone": "browser", "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": panels,
    }


def dashboard_configmap(settings: K8sSettings, plan: Any = None) -> dict[str, Any]:
    """The ConfigMap Grafana's sidecar loads (label ``grafana_dashboard: "1"``)."""
    m = meta(settings, f"{settings.release}-grafana-dashboard", "monitoring")
    m["labels"] = {**m["labels"], "grafana_dashboard": "1"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": m,
            "data": {"polyspec.json": json.dumps(dashboard(settings, plan), indent=1, sort_keys=True)}}
