"""Deployments as the router reads them, and live statistics from several routers."""

from __future__ import annotations

import json

import pytest

from polyspec.registry import AlreadyExists, RegistryError


def test_active_deployment_view(reg, base_draft, verifier_rec) -> None:
    reg.add_evaluation(base_draft.ref, benchmark="mtbench", language="en", k=3, acceptance=[0.5, 0.3, 0.1])
    reg.add_evaluation(base_draft.ref, benchmark="heldout", language="en", k=3, acceptance=[0.6, 0.3, 0.1])
    reg.add_evaluation(base_draft.ref, benchmark="live", language="fr", k=3, acceptance=[0.9, 0.9, 0.9],
                       method="live")
    reg.deploy(base_draft.ref, name="en-1", url="http://127.0.0.1:8001", default=True)
    reg.deploy(None, name="plain", url="http://127.0.0.1:8002", languages=["fr"], verifier=verifier_rec.name)
    views = {v.name: v for v in reg.active_deployments()}
    en = views["en-1"]
    assert (en.draft, en.draft_name, en.draft_version, en.k) == ("en-base@1", "en-base", 1, 3)
    assert en.draft_location == base_draft.location and en.verifier_location == verifier_rec.location
    assert en.languages == ["en"] and en.is_default and en.offline_mal == {"en": pytest.approx(2.0)}
    assert views["plain"].draft is None and views["plain"].verifier_name == verifier_rec.name
    reg.deploy(None, name="plain2", url="http://127.0.0.1:8003", default=True, verifier=verifier_rec.name)
    assert [v.name for v in reg.active_deployments() if v.is_default] == ["plain2"]


def test_names_retire_and_undeploy(reg, base_draft) -> None:
    reg.deploy(base_draft.ref, name="en-1", url="http://127.0.0.1:8001")
    with pytest.raises(AlreadyExists):
        reg.deploy(base_draft.ref, name="en-1", url="http://127.0.0.1:8009")
    with pytest.raises(RegistryError, match="en-1"):
        reg.retire(base_draft.ref)
    with pytest.raises(RegistryError, match="http"):
        reg.deploy(base_draft.ref, name="bad", url="127.0.0.1:80")
    reg.undeploy("en-1")
    assert reg.active_deployments() == [] and reg.deployments(include_stopped=True)[0].status == "stopped"
    assert reg.retire(base_draft.ref).status == "retired"
    with pytest.raises(RegistryError, match="retired"):
        reg.deploy(base_draft.ref, name="en-1", url="http://127.0.0.1:8001")


def test_live_stats_add_up_per_key_and_across_routers(reg) -> None:
    row = {"language": "fr", "domain": "general", "draft_name": "fr-ft@1", "requests": 2, "completion_tokens": 50,
           "num_spec_steps": 20, "num_draft_tokens": 60, "num_accepted_tokens": 30, "accepted_per_pos": [15, 10, 5]}
    reg.record_live_stats("r1", [row])
    reg.record_live_stats("r1", [row, {**row, "language": "en"}])
    reg.record_live_stats("r2", [{**row, "accepted_per_pos": [15, 10, 5, 1]}])
    assert reg.live_stats(router_id="r1")[1].requests == 4
    fr = next(s for s in reg.live_stats() if s.language == "fr")
    assert (fr.requests, fr.num_spec_steps, fr.accepted_per_pos) == (6, 60, [45, 30, 15, 1])
    assert fr.mean_acceptance_length == pytest.approx(1 + 90 / 60)
    with pytest.raises(RegistryError):
        reg.record_live_stats("r1", [row, {**row, "requests": -1}])
    assert next(s for s in reg.live_stats() if s.language == "fr").requests == 6  # the whole batch rolled back


def test_cli_deploy(cli, base_draft) -> None:
    res = cli("deploy", base_draft.ref, "--name", "en-local", "--launch", '{"port": 8101}', "--json")
    assert res.exit_code == 0, res.stderr
    listed = json.loads(cli("deployments", "--json").stdout)
    assert [(d["name"], d["draft"], d["launch"]) for d in listed] == [("en-local", "en-base@1", {"port": 8101})]
    assert cli("undeploy", "en-local").exit_code == 0
    assert cli("undeploy", "en-local").exit_code == 3  # NotFoundError
