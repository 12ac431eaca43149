"""`polyspec up --plan plan.yaml` (polyspec/fleet/from_plan.py): exactly the plan's fleet, and every bad plan
refused before anything is written or started."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.registry.conftest import reg, verifier_rec  # noqa: F401 - the registry tests' own fixtures
from tests.registry.test_fleet_plan import MIX, drafts  # noqa: F401 - the planner tests' registry fixture


@pytest.fixture()
def started(monkeypatch):
    """run_up replaced: what `polyspec up` would start, recorded (no engine runs); 64 GiB of memory free."""
    import polyspec.fleet.from_plan as from_plan
    import polyspec.up

    runs: list = []
    monkeypatch.setattr(from_plan, "available_gib", lambda: 64.0)
    monkeypatch.setattr(polyspec.up, "run_up", lambda plan, **kw: runs.append(plan))
    return runs


@pytest.fixture()
def plan_file(drafts, registry_url, tmp_path) -> Path:  # noqa: F811 - the fixture imported above
    from polyspec.cli import app

    path = tmp_path / "plan.yaml"
    out = CliRunner().invoke(app, ["deploy", "plan", "--registry", registry_url, "--memory-gib", "64",
                                   "--engines", "3", "--traffic", MIX, "--write", str(path)])
    assert out.exit_code == 0, out.output
    return path


def _up(registry_url: str, *args: str):
    from polyspec.cli import app

    return CliRunner().invoke(app, ["up", "--registry", registry_url, *args])


def test_up_serves_exactly_the_plan(reg, drafts, plan_file, registry_url, started) -> None:  # noqa: F811
    reg.deploy(drafts["fr-spec"], name="old-fr", languages=["fr"], launch={"port": 9400})  # not in the plan
    out = _up(registry_url, "--plan", str(plan_file))
    assert out.exit_code == 0, out.output
    [up] = started
    plan = yaml.safe_load(plan_file.read_text())
    wanted = {(e["name"], e["draft"], e["k"]) for e in plan["entries"]}
    members = {(m.name, m.draft, m.launch["k"] if m.draft else 0) for m in up.members}
    assert members == wanted and len(up.members) == 2  # the old deployment is not launched
    deps = {d.name: d for d in reg.active_deployments()}
    default = next(e["name"] for e in plan["entries"] if e["default"])
    assert deps[default].is_default
    # Served again: the deployments are kept, nothing is duplicated.
    assert _up(registry_url, "--plan", str(plan_file)).exit_code == 0
    assert {d.name for d in reg.active_deployments()} == set(deps)


def _edit(path: Path, tmp_path: Path, change) -> Path:
    raw = yaml.safe_load(path.read_text())
    change(raw)
    out = tmp_path / "edited.yaml"
    out.write_text(yaml.safe_dump(raw))
    return out


def _set_verifier(raw):
    raw["verifier"] = "another-verifier"


def _ghost_draft(raw):
    next(e for e in raw["entries"] if e["draft"])["draft"] = "ghost-draft@1"


def _schema(raw):
    raw["schema_version"] = 7


def _many(raw):
    raw["engines"] = 40
    raw["entries"][0]["replicas"] = 39


@pytest.mark.parametrize(("change", "code", "message"), [
    (_set_verifier, 2, "plan for verifier 'another-verifier'"),
    (_ghost_draft, 3, "ghost-draft@1"),
    (_schema, 2, "schema_version 7"),
    (_many, 2, "do not fit in memory"),
])
def test_a_bad_plan_starts_nothing(reg, plan_file, registry_url, tmp_path, started, change, code, message) -> None:  # noqa: F811
    before = {d.name for d in reg.active_deployments()}
    out = _up(registry_url, "--plan", str(_edit(plan_file, tmp_path, change)))
    assert out.exit_code == code, out.output
    assert message in (out.stderr or out.output)
    assert started == [] and {d.name for d in reg.active_deployments()} == before  # nothing written or started


@pytest.mark.parametrize(("text", "message"), [("entries: [unclosed\n", "cannot read plan file"),
                                               ("- a list\n", "must be a mapping"),
                                               ("", "schema_version None")])
def test_a_malformed_plan_file_starts_nothing(reg, drafts, registry_url, tmp_path, started, text, message) -> None:  # noqa: F811
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    out = _up(registry_url, "--plan", str(path))
    assert out.exit_code == 2 and message in (out.stderr or out.output)
    assert started == [] and reg.active_deployments() == []
    missing = _up(registry_url, "--plan", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 2 and "not found" in (missing.stderr or missing.output)


def test_up_on_an_empty_registry_plans_for_the_memory_it_has(reg, drafts, registry_url, started,  # noqa: F811
                                                              monkeypatch) -> None:
    """No --plan and no deployment: the plan for the engines free memory holds (here 8 GiB: two), over the
    active drafts' languages; `--plan auto` asks for the same. Below one engine's memory nothing starts."""
    import polyspec.fleet.from_plan as from_plan

    monkeypatch.setattr(from_plan, "available_gib", lambda: 8.0)
    out = _up(registry_url)
    assert out.exit_code == 0, out.output
    assert "Fleet for 2 engine slot(s)" in out.stdout
    [up] = started
    assert {m.draft for m in up.members} <= set(drafts.values()) | {None} and 1 <= len(up.members) <= 2
    assert {d.name for d in reg.active_deployments()} == {m.name for m in up.members}
    assert _up(registry_url, "--plan", "auto").exit_code == 0
    monkeypatch.setattr(from_plan, "available_gib", lambda: 2.0)
    for d in reg.active_deployments():
        reg.undeploy(d.name)
    low = _up(registry_url)
    assert low.exit_code == 2 and "no engine fits in memory" in (low.stderr or low.output)
    assert len(started) == 2 and reg.active_deployments() == []
