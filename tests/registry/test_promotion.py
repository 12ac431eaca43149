"""The promotion gate: accept on a real gain, refuse with the exact reason, --force is recorded, --replace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyspec.registry import PromotionRefused, RegistryError


def _eval(reg, draft: str, lang: str, mal_first: float, *, benchmark: str = "mtbench", subset: str = "all") -> None:
    """An evaluation whose mean acceptance length is 1 + mal_first + its two decayed successors."""
    a1 = mal_first
    reg.add_evaluation(draft, benchmark=benchmark, language=lang, k=3, acceptance=[a1, a1 * 0.5, a1 * 0.25],
                       num_prompts=80, num_tokens=16000, method="offline", subset=subset,
                       degenerate_share=None if subset == "all" else 0.25)


def _candidate(reg, base_draft, base_draft_dir: Path, name: str = "fr-ft", languages=("fr",)):
    return reg.import_draft(base_draft_dir, verifier=base_draft.verifier, name=name, languages=list(languages),
                            parent=base_draft.ref)


@pytest.fixture()
def scene(reg, base_draft, base_draft_dir: Path):
    """en-base (active) measured on en and fr; a French fine-tune candidate, child of en-base."""
    _eval(reg, base_draft.ref, "en", 0.40)  # MAL 1.70
    _eval(reg, base_draft.ref, "fr", 0.20)  # MAL 1.35
    return _candidate(reg, base_draft, base_draft_dir)


def test_gain_on_target_and_flat_elsewhere_passes(reg, scene) -> None:
    _eval(reg, scene.ref, "fr", 0.36)  # 1.35 -> 1.63
    _eval(reg, scene.ref, "en", 0.395)  # 1.70 -> 1.691, within epsilon
    res = reg.promote(scene.ref)
    assert res.passed and not res.forced and reg.get_draft(scene.ref).status == "active"
    fr = next(c for c in res.comparisons if c["language"] == "fr")
    assert (fr["baseline"], fr["before"], fr["after"]) == ("en-base@1", 1.35, 1.63)
    assert reg.events()[0].kind == "promote"
    assert reg.get_draft("en-base@1").status == "active"  # no --replace: the parent keeps serving English


def test_refusals_say_which_language_and_by_how_much(reg, scene) -> None:
    _eval(reg, scene.ref, "fr", 0.205)  # +0.009 < delta
    _eval(reg, scene.ref, "en", 0.30)  # 1.70 -> 1.525
    with pytest.raises(PromotionRefused) as err:
        reg.promote(scene.ref)
    failures = err.value.failures
    assert any(f.startswith("fr:") and "1.350 -> 1.359" in f for f in failures)
    assert any(f.startswith("en:") and "fell 1.700 -> 1.525" in f for f in failures)
    assert reg.get_draft(scene.ref).status == "candidate" and reg.events() == []


def test_force_is_recorded(reg, scene) -> None:
    _eval(reg, scene.ref, "fr", 0.20)
    res = reg.promote(scene.ref, force=True)
    assert res.forced and res.failures and reg.get_draft(scene.ref).status == "active"
    event = reg.events()[0]
    assert event.kind == "promote-forced" and event.details["failures"] == res.failures


def test_no_evaluation_or_no_comparable_evaluation_is_refused(reg, scene) -> None:
    with pytest.raises(PromotionRefused, match="no evaluation for fr"):
        reg.promote(scene.ref)
    _eval(reg, scene.ref, "fr", 0.5, benchmark="heldout")
    with pytest.raises(PromotionRefused, match="no evaluation comparable"):
        reg.promote(scene.ref)


def test_the_gate_compares_like_with_like_subsets(reg, scene) -> None:
    """A figure over non-degenerate answers is never compared with one over all answers."""
    _eval(reg, scene.ref, "fr", 0.60, subset="non_degenerate")  # would be a large 'gain' against 'all'
    with pytest.raises(PromotionRefused, match="same benchmark, method, k, domain and subset"):
        reg.promote(scene.ref)
    _eval(reg, "en-base@1", "fr", 0.30, subset="non_degenerate")  # the baseline's own non-degenerate figure
    _eval(reg, scene.ref, "fr", 0.205)  # over all answers: +0.009, not enough
    with pytest.raises(PromotionRefused) as err:
        reg.promote(scene.ref)
    assert [f for f in err.value.failures if f.startswith("fr:")] == [
        "fr: mean acceptance length 1.350 -> 1.359 on mtbench/offline/k=3/all (vs en-base@1), gain +0.009 < 0.02"]
    _eval(reg, scene.ref, "fr", 0.36)
    res = reg.promote(scene.ref)
    fr = {c["subset"]: c for c in res.comparisons if c["language"] == "fr"}
    assert (fr["all"]["before"], fr["non_degenerate"]["before"], fr["non_degenerate"]["after"]) == (1.35, 1.525, 2.05)


def test_evaluation_subset_is_checked(reg, base_draft) -> None:
    from polyspec.registry import InvalidEvaluation

    with pytest.raises(InvalidEvaluation, match="subset must be one of all, non_degenerate"):
        _eval(reg, base_draft.ref, "fr", 0.2, subset="clean")
    with pytest.raises(InvalidEvaluation, match="degenerate_share must lie in"):
        reg.add_evaluation(base_draft.ref, benchmark="b", language="fr", k=1, acceptance=[0.2], degenerate_share=1.5)
    _eval(reg, base_draft.ref, "fr", 0.2, subset="non_degenerate")
    [ev] = reg.evaluations(base_draft.ref, subset="non_degenerate")
    assert ev.subset == "non_degenerate" and ev.degenerate_share == 0.25
    assert reg.evaluations(base_draft.ref, subset="all") == []


def test_first_draft_for_a_language_needs_only_an_evaluation(reg, verifier_rec, base_draft_dir: Path) -> None:
    ja = reg.import_draft(base_draft_dir, verifier=verifier_rec.name, name="ja-scratch", languages=["ja"])
    with pytest.raises(PromotionRefused):
        reg.promote(ja.ref)
    _eval(reg, ja.ref, "ja", 0.1)
    res = reg.promote(ja.ref)
    assert res.passed and res.comparisons[0]["baseline"] is None


def test_replace_retires_the_superseded_draft_and_moves_its_deployment(reg, scene, base_draft_dir: Path) -> None:
    _eval(reg, scene.ref, "fr", 0.36)
    reg.promote(scene.ref)
    reg.deploy(scene.ref, name="fr-engine", launch={"port": 8101})
    v2 = _candidate(reg, reg.get_draft("en-base@1"), base_draft_dir)
    assert v2.ref == "fr-ft@2"
    _eval(reg, v2.ref, "fr", 0.50)
    res = reg.promote(v2.ref, replace=True)
    assert res.retired == ["fr-ft@1"] and res.repointed_deployments == ["fr-engine"]
    assert reg.get_draft("fr-ft@1").status == "retired" and reg.get_draft("en-base@1").status == "active"
    assert [d.draft for d in reg.active_deployments()] == ["fr-ft@2"]
    with pytest.raises(RegistryError, match="already active"):
        reg.promote(v2.ref)


def test_cli_promote(cli, reg, scene) -> None:
    _eval(reg, scene.ref, "fr", 0.21)
    refused = cli("promote", scene.ref, "--json")
    assert refused.exit_code == 1 and "fr:" in refused.stderr
    assert json.loads(refused.stdout)["failures"][0].startswith("fr:")
    res = cli("add-evaluation", scene.ref, "--benchmark", "mtbench", "--language", "fr",
              "--acceptance", "0.4,0.3,0.2", "--prompts", "80")
    assert res.exit_code == 0 and "1.900" in res.stdout
    ok = cli("promote", scene.ref, "--delta", "0.5")
    assert ok.exit_code == 0, ok.stderr
    assert "is now active (passed)" in ok.stdout


def test_gain_on_requires_the_gain_on_those_benchmarks_and_no_loss_on_the_others(reg, scene) -> None:
    """As adapt promotes: a gain on the live set it trained for; its language's MT-Bench only must not fall."""
    _eval(reg, "en-base@1", "fr", 0.30, benchmark="live-fr-1234abcd")  # MAL 1.525
    _eval(reg, scene.ref, "fr", 0.36, benchmark="live-fr-1234abcd")  # 1.525 -> 1.63: a gain
    _eval(reg, scene.ref, "fr", 0.195)  # mtbench 1.35 -> 1.341: no gain, within epsilon
    _eval(reg, scene.ref, "en", 0.40)  # English unchanged
    with pytest.raises(PromotionRefused, match=r"fr: mean acceptance length 1\.350 -> 1\.341 on mtbench"):
        reg.promote(scene.ref)  # without gain_on the gain is required everywhere
    res = reg.promote(scene.ref, gain_on=["live-fr-1234abcd"])
    assert res.passed and reg.get_draft(scene.ref).status == "active"
    required = {(c["language"], c["benchmark"], c["required"]) for c in res.comparisons}
    assert required == {("fr", "live-fr-1234abcd", "gain"), ("fr", "mtbench", "no loss"), ("en", "mtbench", "no loss")}
    assert reg.events()[0].details["gain_on"] == ["live-fr-1234abcd"]


def test_gain_on_refuses_a_loss_beyond_epsilon_and_a_missing_benchmark(reg, scene) -> None:
    _eval(reg, scene.ref, "fr", 0.15)  # mtbench 1.35 -> 1.2625: a loss beyond epsilon
    _eval(reg, "en-base@1", "fr", 0.30, benchmark="live-fr-1234abcd")
    _eval(reg, scene.ref, "fr", 0.36, benchmark="live-fr-1234abcd")
    with pytest.raises(PromotionRefused, match=r"fr: mean acceptance length fell 1\.350 -> 1\.262 on mtbench"):
        reg.promote(scene.ref, gain_on=["live-fr-1234abcd"])
    # The gain must be measured somewhere: a benchmark no evaluation names refuses (no gain was shown).
    with pytest.raises(PromotionRefused, match="no evaluation on live-fr-ffffffff comparable"):
        reg.promote(scene.ref, gain_on=["live-fr-ffffffff"], epsilon=0.1)
    for bad in ([], [""], ["  "]):
        with pytest.raises(RegistryError, match="gain_on names no benchmark"):
            reg.promote(scene.ref, gain_on=bad)
    assert reg.get_draft(scene.ref).status == "candidate"


def test_cli_promote_gain_on(cli, reg, scene) -> None:
    _eval(reg, "en-base@1", "fr", 0.30, benchmark="live-fr-1234abcd")
    _eval(reg, scene.ref, "fr", 0.36, benchmark="live-fr-1234abcd")
    _eval(reg, scene.ref, "fr", 0.195)
    refused = cli("promote", scene.ref)
    assert refused.exit_code == 1 and "1.350 -> 1.341 on mtbench" in refused.stderr
    empty = cli("promote", scene.ref, "--gain-on", "")
    assert empty.exit_code == 1 and "gain_on names no benchmark" in empty.stderr
    ok = cli("promote", scene.ref, "--gain-on", "live-fr-1234abcd")
    assert ok.exit_code == 0 and "is now active (passed)" in ok.stdout, ok.stderr
