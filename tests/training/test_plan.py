"""`polyspec train --plan LANG`: the registry's add-language plan becomes a run config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import pack_rows, write_jsonl
from polyspec.training.errors import PlanError
from polyspec.training.plan import config_from_plan

REPO = Path(__file__).resolve().parents[2]


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

    env = {**os.environ, "POLYSPEC_REGISTRY_URL": reg_with_active_draft.url}
    shown = subprocess.run([sys.executable, "-m", "polyspec.cli", "train", "--plan", "fr", "--show", "--run-id", "x"],
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["parent_draft"] == "en-base@1"
    missing = subprocess.run([sys.executable, "-m", "polyspec.cli", "train", "--plan", "de"],
                             capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert missing.returncode == 2 and "no add-language plan for 'de'" in missing.stderr
