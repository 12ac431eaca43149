"""What adapt trains for a language (polyspec.adapt.train.plan_training): a fine-tune of the draft serving it,
or, where the language's recorded profile says another vocabulary is needed, a specialist with its own; the
reason says which and why."""

from __future__ import annotations

from typing import Any

import pytest

from polyspec.adapt.train import plan_training
from tests.adapt.conftest import EN_DRAFT


def _profile(reg: Any, code: str, plan: str, reason: str, script: str = "Thai") -> None:
    """A language profile as `polyspec registry add-language` records it (here without measuring a tokenizer)."""
    from polyspec.registry.schema import LanguageProfile, Verifier

    with reg.session(write=True) as s:
        verifier = s.query(Verifier).filter_by(name="smollm2-135m-instruct").one()
        s.add(LanguageProfile(code=code, verifier_id=verifier.id, name=code, script=script, is_latin=int(script == "Latin"), coverage={},
                              plan=plan, reason=reason, details={}))


def test_without_a_profile_the_draft_serving_english_is_fine_tuned(adapt_reg) -> None:
    plan = plan_training(adapt_reg, "it", "general", None, measure=False)
    assert (plan.mode, plan.parent_ref) == ("finetune", f"{EN_DRAFT}@1")
    assert "no language profile yet" in plan.reason


@pytest.mark.parametrize("profile_plan", ["from-scratch-custom-vocab", "extend-multilingual"])
def test_a_profile_that_needs_another_vocabulary_trains_a_specialist(adapt_reg, profile_plan) -> None:
    _profile(adapt_reg, "th", profile_plan, "Thai script: 12% of its tokens in the draft's vocabulary")
    plan = plan_training(adapt_reg, "th", "general", None, measure=False)
    assert plan.mode == "from-scratch-custom-vocab"
    assert plan.reason.startswith("Thai script: 12%")
    # The profile's extend-multilingual advice is not what adapt does: the reason says so and how to do it.
    said = "adapt trains a th specialist with its own vocabulary" in plan.reason
    assert said == (profile_plan == "extend-multilingual")
    if said:
        assert "polyspec train --plan th --prompts FILE" in plan.reason


def test_a_profile_that_says_finetune_fine_tunes(adapt_reg) -> None:
    _profile(adapt_reg, "pt", "finetune", "Latin script: covered", script="Latin")
    plan = plan_training(adapt_reg, "pt", "general", None, measure=False)
    assert (plan.mode, plan.reason) == ("finetune", "Latin script: covered")
