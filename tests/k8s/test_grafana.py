"""`polyspec deploy k8s` renders a Grafana dashboard ConfigMap (polyspec/k8s/grafana.py) whose every query
names a metric the router exports (router/telemetry.py), grouped by labels that metric has."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import by_kind, read_manifests, validate
from tests.registry.test_fleet_plan import MIX, drafts  # noqa: F401 - the planner tests' registry fixture

METRIC = re.compile(r"\bpolyspec_[a-z_]+\b")
GROUPING = re.compile(r"\bby \(([^)]*)\)")
SUFFIXES = {"counter": ("_total",), "histogram": ("_sum", "_count", "_bucket"), "gauge": ("",)}


def exported() -> dict[str, set[str]]:
    """Every series name the router exports -> the labels it carries."""
    from polyspec.router.telemetry import Metrics

    out: dict[str, set[str]] = {}
    for metric in vars(Metrics()).values():
        kind, name = getattr(metric, "_type", None), getattr(metric, "_name", None)
        if kind in SUFFIXES and name:
            for suffix in SUFFIXES[kind]:
                out[name + suffix] = set(metric._labelnames) | ({"le"} if suffix == "_bucket" else set())
    return out


def unknown_names(expr: str, known: dict[str, set[str]]) -> list[str]:
    """Metric names in ``expr`` the router does not export, and grouping labels one of its metrics lacks."""
    names = METRIC.findall(expr)
    problems = [n for n in names if n not in known]
    for group in GROUPING.findall(expr):
        for label in (part.strip() for part in group.split(",") if part.strip()):
            problems += [f"{n} has no label {label}" for n in names if n in known and label not in known[n]]
    return problems


def _dashboard(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [cm] = [d for d in by_kind(docs, "ConfigMap").values() if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    validate(cm)
    return json.loads(cm["data"]["polyspec.json"])


def test_every_query_names_a_metric_the_router_exports(polyspec_cli, verifier, tmp_path: Path) -> None:
    code, _, stderr = polyspec_cli("deploy", "k8s", "--example", "--out", str(tmp_path / "out"))
    assert code == 0, stderr
    board = _dashboard(read_manifests(tmp_path / "out"))
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 8
    known = exported()
    assert {n for e in exprs for n in METRIC.findall(e)} >= {
        "polyspec_spec_accepted_tokens_total", "polyspec_predicted_tokens_per_second",
        "polyspec_request_tokens_per_second_sum", "polyspec_route_choices_total"}
    for expr in exprs:
        assert unknown_names(expr, known) == [], expr
    titles = " / ".join(p["title"] for p in board["panels"])
    for wanted in ("acceptance", "tokens/s per language", "Predicted against observed", "Decisions per engine"):
        assert wanted in titles


@pytest.mark.parametrize("expr", ["sum(rate(polyspec_spec_acceptance_total[5m]))",
                                  "sum by (backend) (rate(polyspec_spec_steps_total[5m]))",
                                  "polyspec_route_choices"])
def test_the_check_is_not_vacuous(expr: str) -> None:
    assert unknown_names(expr, exported())


def test_a_plan_renders_its_fleet_and_shows_on_the_dashboard(polyspec_cli, reg, drafts, registry_url,  # noqa: F811
                                                              tmp_path: Path) -> None:
    """`deploy k8s --plan`: one engine Deployment per plan entry, with the entry's replicas and k; the
    dashboard's first panel is the plan's per-cell predictions. A bad plan renders nothing."""
    import yaml

    plan_path = tmp_path / "plan.yaml"
    code, _, stderr = polyspec_cli("deploy", "plan", "--registry", registry_url, "--memory-gib", "64", "--engines", "3",
                                   "--traffic", MIX, "--write", str(plan_path))
    assert code == 0, stderr
    raw = yaml.safe_load(plan_path.read_text())
    raw["entries"][0]["replicas"] = 2  # a third engine as a replica, by hand
    plan_path.write_text(yaml.safe_dump(raw))
    code, _, stderr = polyspec_cli("deploy", "k8s", "--registry", registry_url, "--plan", str(plan_path),
                                   "--out", str(tmp_path / "out"))
    assert code == 0, stderr
    docs = read_manifests(tmp_path / "out")
    for doc in docs:
        validate(doc)
    engines = {name: d for name, d in by_kind(docs, "Deployment").items() if name != "polyspec-router"}
    assert {name.removeprefix("polyspec-") for name in engines} == {e["name"] for e in raw["entries"]}
    for entry in raw["entries"]:
        engine = engines[f"polyspec-{entry['name']}"]
        assert engine["spec"]["replicas"] == entry["replicas"]
        args = next(c for c in engine["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")["args"]
        spec = json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else None
        assert (spec or {}).get("num_speculative_tokens", 0) == entry["k"]
    board = _dashboard(docs)
    assert board["panels"][0]["type"] == "text"
    assert all(f"| {p['language']} |" in board["panels"][0]["options"]["content"] for p in raw["predicted"])
    raw["verifier"] = "another-verifier"
    plan_path.write_text(yaml.safe_dump(raw))
    code, _, stderr = polyspec_cli("deploy", "k8s", "--registry", registry_url, "--plan", str(plan_path),
                                   "--out", str(tmp_path / "bad"))
    assert code == 2 and "plan for verifier 'another-verifier'" in stderr
    assert not (tmp_path / "bad").exists()
