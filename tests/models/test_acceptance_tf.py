"""Teacher-forced chain acceptance (models.acceptance_tf) gives the step-by-step histogram, batched."""

from __future__ import annotations

import pytest
import torch

from polyspec.models.acceptance import AcceptanceError, OfflineSpeculator, chat_prompt_ids
from polyspec.models.acceptance_tf import TeacherForcedAcceptance, _ttt_mask
from polyspec.models.draft_build import load_draft
from polyspec.models.hidden import load_verifier_model
from polyspec.models.shipped import shipped_for_language
from polyspec.training.benchmarks import load_mtbench

K, BUDGET = 3, 32


@pytest.fixture(scope="module")
def setup(verifier):
    model, tok = load_verifier_model(verifier.path, device="cpu", dtype=torch.float32)
    draft = load_draft(shipped_for_language(verifier.name, "fr").path, verifier.path)
    tf = TeacherForcedAcceptance(model, tok, draft.config.eagle_aux_hidden_state_layer_ids, k=K, max_new_tokens=BUDGET)
    prompts = {lang: [p.text for p in items] for lang, items in load_mtbench(["en", "fr"], limit=2).items()}
    for lang, texts in prompts.items():
        tf.add(lang, texts, batch_size=2, progress=False)
    return model, tok, draft, tf, prompts


@pytest.mark.parametrize("lang", ["en", "fr"])
def test_same_histogram_as_step_by_step_decoding(setup, lang):
    """Every spec step of OfflineSpeculator is found, with the same accepted count, in the same order."""
    model, tok, draft, tf, prompts = setup
    result = tf.measure(draft, lang)
    spec = OfflineSpeculator(model, tok, draft, k=K)
    for prompt, detail in zip(prompts[lang], result.details, strict=True):
        ref = spec.run(chat_prompt_ids(tok, prompt), BUDGET)
        assert detail.output_ids == ref.output_ids
        assert [s[2] for s in detail.steps] == [s[2] for s in ref.steps]
        assert [s[0] for s in detail.steps] == [s[0] for s in ref.steps]
    assert result.num_spec_steps > 0 and sum(result.histogram[1:]) > 0  # the trained draft does accept


def test_shorter_budget_is_a_prefix_of_the_walk(setup):
    _, _, draft, tf, _ = setup
    full, short = tf.measure(draft, "fr"), tf.measure(draft, "fr", max_new_tokens=16)
    assert short.num_spec_steps < full.num_spec_steps
    for a, b in zip(short.details, full.details, strict=True):
        assert [s[2] for s in a.steps] == [s[2] for s in b.steps][: len(a.steps)]


def test_ttt_mask_shape_and_pattern():
    mask = _ttt_mask(3, 2, "cpu")[0, 0]
    assert mask.shape == (6, 6)
    assert mask[0].tolist() == [True, False, False, False, False, False]  # step 1: causal
    assert mask[4].tolist() == [True, True, False, False, True, False]  # step 2 of chain 1: keys <= 1, itself


def test_bad_arguments(setup):
    model, tok, draft, tf, _ = setup
    with pytest.raises(AcceptanceError, match="k must be"):
        TeacherForcedAcceptance(model, tok, [2, 15, 27], k=0)
    with pytest.raises(AcceptanceError, match="unknown group"):
        tf.measure(draft, "de")
    with pytest.raises(AcceptanceError, match="trajectories hold"):
        tf.measure(draft, "fr", max_new_tokens=BUDGET + 1)
    with pytest.raises(AcceptanceError, match="no prompts"):
        tf.add("empty", [])
    other = TeacherForcedAcceptance(model, tok, [1, 2, 3], k=K, max_new_tokens=BUDGET)
    other.groups["fr"] = tf.groups["fr"]
    with pytest.raises(AcceptanceError, match="aux layers"):
        other.measure(draft, "fr")
