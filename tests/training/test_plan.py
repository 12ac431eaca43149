"""`polyspec train --plan LANG`: the registry's add-language plan becomes a run config."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from polyspec.core.languages import UnknownLanguage
from polyspec.core.settings import reset_settings_cache
from polyspec.models.drafts import vocab_size_within
from polyspec.models.shipped import MAX_WEIGHTS_BYTES, find_draft
from polyspec.registry.schema import LanguageProfile
from polyspec.training.cli import app as train_app
from polyspec.training.errors import PlanError
from polyspec.training.multilingual import MixError
from polyspec.training.plan import EXTEND_SHARE, config_from_plan
from tests.cli import polyspec
from tests.training.conftest import pack_rows, write_jsonl


@pytest.fixture()
def reg_with_active_draft(registry_url: str, verifier, base_draft_dir: Path):
    from polyspec.registry import open_registry

    reg = open_registry(registry_url)
    reg.add_verifier(verifier)
    reg.import_draft(base_draft_dir, verifier=verifier.name, name="en-base", languages=["en"], status="active")
    yield reg
    reg.close()


def test_plan_picks_mode_parent_and_prompts(reg_with_active_draft, shared_data: Path, tmp_path: Path) -> None:
    fr = write_jsonl(tmp_path / "fr.jsonl", pack_rows(shared_data, "fr", "general", 40))
    ru = write_jsonl(tmp_path / "ru.jsonl", pack_rows(shared_data, "ru", "general", 40))
    reg_with_active_draft.add_language("fr", fr)
    reg_with_active_draft.add_language("ru", ru)
    fr_cfg = config_from_plan("fr", run_id="plan-fr", max_prompts=30)
    assert (fr_cfg.mode, fr_cfg.parent_draft, fr_cfg.vocab_source) == ("finetune", "en-base@1", "parent")
    assert fr_cfg.prompts.files == [fr.resolve()] and fr_cfg.prompts.max_prompts == 30
    assert fr_cfg.fit.lr == 6e-5 and fr_cfg.fit.epochs == 2  # the recipe defaults
    ru_cfg = config_from_plan("ru")
    assert (ru_cfg.mode, ru_cfg.vocab_source) == ("from-scratch-custom-vocab", "data")
    assert ru_cfg.run_id.startswith("ru-from-scratch-custom-vocab-")
    with pytest.raises(PlanError, match="polyspec registry add-language de"):
        config_from_plan("de")

    env = {"POLYSPEC_REGISTRY_URL": reg_with_active_draft.url}
    shown = polyspec("train", "--plan", "fr", "--show", "--run-id", "x", **env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["parent_draft"] == "en-base@1"
    missing = polyspec("train", "--plan", "de", **env)
    assert missing.returncode == 2 and "no add-language plan for 'de'" in missing.stderr


# ---- extend-multilingual: the multilingual draft trained on its languages plus LANG ------------------------------

MULTI = "smollm2-135m-instruct-multi"


def _more_rows(shared_data: Path, lang: str, n: int) -> list[dict]:
    with gzip.open(shared_data / "train" / "more" / f"{lang}.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for _, line in zip(range(n), fh)]


def _made_for() -> list[str]:
    """The languages the multilingual draft is registered for here: the shipped draft's, Portuguese left out,
    so that Portuguese is the language these tests add to it."""
    return [lang for lang in find_draft(MULTI).languages if lang != "pt"]


@pytest.fixture()
def reg_with_multi(reg_with_active_draft, verifier):
    """The test registry with the shipped multilingual draft registered (made for every pack language but
    Portuguese) and active beside en-base."""
    shipped = find_draft(MULTI)
    reg_with_active_draft.import_draft(shipped.path, verifier=verifier.name, name=MULTI, languages=_made_for(),
                                       status="active")
    return reg_with_active_draft


@pytest.fixture()
def pt_prompts(shared_data: Path, tmp_path: Path) -> Path:
    """300 Portuguese news sentences: at coverage target 1.0 they need more new tokens than 25 MB allows."""
    return write_jsonl(tmp_path / "pt.jsonl", _more_rows(shared_data, "pt", 300))


def _state(reg, home: Path) -> tuple:
    """What a refused plan must leave as it was: the registry's drafts and profiles, and the runs."""
    runs = home / "runs"
    return ([d.ref for d in reg.drafts()], [(p.language, p.plan, p.draft) for p in reg.languages()],
            sorted(p.name for p in runs.iterdir()) if runs.is_dir() else [])


def test_extend_plan_grows_the_multilingual_draft_by_lang(reg_with_multi, pt_prompts: Path, tmp_path: Path) -> None:
    profile = reg_with_multi.add_language("pt", pt_prompts)
    assert (profile.plan, profile.draft) == ("extend-multilingual", f"{MULTI}@1")
    replay = write_jsonl(tmp_path / "replay.jsonl", [{"prompt": "Hello, how are you?"}])
    cfg = config_from_plan("pt", prompts=[replay], max_prompts=500)
    parent = find_draft(MULTI)
    assert cfg.language == "mul" and cfg.mix is not None
    assert cfg.mix.languages == [*_made_for(), "pt"]
    assert cfg.mix.weights["pt"] == EXTEND_SHARE
    assert cfg.mix.weights["en"] == pytest.approx((1 - EXTEND_SHARE) / len(_made_for()))
    assert (cfg.mode, cfg.parent_draft, cfg.registration.draft_name) == ("finetune", f"{MULTI}@1", MULTI)
    assert cfg.prompts.files == [pt_prompts.resolve(), replay.resolve()] and cfg.prompts.max_prompts == 500
    # the vocabulary grows from 12,288 to the largest a draft of its shape has within 25 MB
    room = vocab_size_within(parent.path, MAX_WEIGHTS_BYTES)
    assert cfg.vocab.draft_vocab_size == room and 12288 < room
    assert 1160 * (room - 12288) + (parent.path / "model.safetensors").stat().st_size <= MAX_WEIGHTS_BYTES
    assert cfg.run_id.startswith("pt-extend-multilingual-")
    equal = config_from_plan("pt", prompts=[replay], mix="equal", coverage_target=0.9)
    assert equal.mix.source == "equal" and equal.mix.coverage_target == 0.9
    # the mixture is checked by the same code as `polyspec train run --mix`
    with pytest.raises(MixError, match="missing: "):
        config_from_plan("pt", prompts=[replay], mix="pt=0.5,en=0.5")


def test_extend_plan_refuses_hostile_input(reg_with_multi, pt_prompts: Path, verifier, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    reset_settings_cache()
    replay = write_jsonl(tmp_path / "replay.jsonl", [{"prompt": "Hello, how are you?"}])
    reg_with_multi.add_language("pt", pt_prompts)
    before = _state(reg_with_multi, tmp_path / "home")

    with pytest.raises(PlanError, match="replays its languages en, fr, de.*give them with --prompts FILE"):
        config_from_plan("pt")
    with pytest.raises(PlanError, match="--prompts: no such file: .*nowhere.jsonl"):
        config_from_plan("pt", prompts=[tmp_path / "nowhere.jsonl"])
    with pytest.raises(UnknownLanguage, match="unknown language code 'xx'"):
        config_from_plan("xx", prompts=[replay])
    # a plan that cannot meet the size limit: every pt token needs 574 rows beyond the parent's 12,288; 441 fit
    with pytest.raises(PlanError, match=r"cannot meet coverage target 100\.0% within the 25 MB limit of a draft \(POLYSPEC_MAX_DRAFT_BYTES\): "
                                        r"its prompts .*pt\.jsonl\) need \d+ tokens beyond the 12288 of "):
        config_from_plan("pt", prompts=[replay], coverage_target=1.0)
    # --prompts is for an extend plan only
    fr = write_jsonl(tmp_path / "fr.jsonl", [{"prompt": "Bonjour, pouvez-vous m'aider à écrire une lettre ?"}] * 3)
    reg_with_multi.add_language("fr", fr, threshold=1.0)  # no draft covers fr well enough: from scratch
    with pytest.raises(PlanError, match="--prompts: only for an extend-multilingual plan; the plan for 'fr' is "
                                        "from-scratch-custom-vocab"):
        config_from_plan("fr", prompts=[replay])
    # a profile with no prompts file (measured on the bundled sample alone)
    reg_with_multi.add_language("nl")
    with pytest.raises(PlanError, match="the 'nl' profile records no prompts file"):
        config_from_plan("nl", prompts=[replay])
    after = _state(reg_with_multi, tmp_path / "home")
    assert after[0] == before[0] and after[2] == before[2] == []


def test_extend_plan_refuses_a_parent_of_another_verifier(reg_with_multi, pt_prompts: Path, verifier,
                                                           tmp_path: Path) -> None:
    shipped = find_draft(MULTI)
    reg_with_multi.add_verifier(verifier, name="other-verifier")
    reg_with_multi.import_draft(shipped.path, verifier="other-verifier", name="other-multi",
                                languages=shipped.languages, status="active")
    reg_with_multi.add_language("pt", pt_prompts)
    with reg_with_multi.session(write=True) as s:  # a profile that names the other verifier's draft
        s.scalars(select(LanguageProfile).where(LanguageProfile.code == "pt")).one().draft = "other-multi@1"
    replay = write_jsonl(tmp_path / "replay.jsonl", [{"prompt": "Hello"}])
    with pytest.raises(PlanError, match=f"parent draft other-multi@1, which is made for verifier other-verifier, not "
                                        f"{verifier.name}"):
        config_from_plan("pt", prompts=[replay])
    with reg_with_multi.session(write=True) as s:  # a profile that names a one-language draft
        s.scalars(select(LanguageProfile).where(LanguageProfile.code == "pt")).one().draft = "en-base@1"
    with pytest.raises(PlanError, match="parent draft en-base@1, which is made for en alone"):
        config_from_plan("pt", prompts=[replay])


def test_extend_plan_without_a_registered_multilingual_draft(reg_with_active_draft, pt_prompts: Path,
                                                             tmp_path: Path) -> None:
    """add-language weighed the shipped multilingual draft, but the registry holds none to train from."""
    profile = reg_with_active_draft.add_language("pt", pt_prompts, shipped=True)
    assert (profile.plan, profile.draft) == ("extend-multilingual", MULTI)
    replay = write_jsonl(tmp_path / "replay.jsonl", [{"prompt": "Hello"}])
    with pytest.raises(PlanError, match=f"no active multilingual draft of verifier .* is registered \\(the plan names "
                                        f"{MULTI}, which the registry does not hold\\); register one: polyspec "
                                        "registry import-draft"):
        config_from_plan("pt", prompts=[replay])
    assert [d.ref for d in reg_with_active_draft.drafts()] == ["en-base@1"]


def test_plan_cli_removes_the_run_when_a_replayed_language_has_no_prompts(
        reg_with_multi, shared_data: Path, verifier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(Path(verifier.path).parent)  # the prepared verifier, not built again
    monkeypatch.setenv("POLYSPEC_HOME", str(home))
    reset_settings_cache()
    pt = write_jsonl(tmp_path / "pt.jsonl", _more_rows(shared_data, "pt", 24))
    reg_with_multi.add_language("pt", pt)
    en_fr = write_jsonl(tmp_path / "en_fr.jsonl", pack_rows(shared_data, "en", "general", 6)
                        + pack_rows(shared_data, "fr", "general", 6))
    result = CliRunner().invoke(train_app, ["--plan", "pt", "--prompts", str(en_fr), "--run-id", "pt-extend"])
    assert result.exit_code == 2, result.output
    assert ("no prompts for de, es, it, ru, zh, ja, ko, ar, hi, th, id, nl, pl, tr, vi in pt.jsonl, en_fr.jsonl"
            in result.output), result.output
    assert "run pt-extend removed" in result.output and not (home / "runs" / "pt-extend").exists()
    assert [d.ref for d in reg_with_multi.drafts()] == ["en-base@1", f"{MULTI}@1"]
