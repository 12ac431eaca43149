"""Offline greedy speculative decoding (models.acceptance) on the bundled verifier."""

from __future__ import annotations

import pytest
import torch

from polyspec.models.acceptance import (
    AcceptanceError,
    AcceptanceResult,
    OfflineSpeculator,
    chat_prompt_ids,
    measure_acceptance_models,
)
from polyspec.models.draft_build import load_draft
from polyspec.models.hidden import capture_hidden_states, load_verifier_model
from polyspec.models.shipped import shipped_for_language
from polyspec.training.benchmarks import load_mtbench

K = 3


@pytest.fixture(scope="module")
def verifier_model(verifier):
    return load_verifier_model(verifier.path, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def trained_draft(verifier, tmp_path_factory):
    return load_draft(shipped_for_language(verifier.name, "en").path, verifier.path)


def test_histogram_to_acceptance_and_mean_length():
    r = AcceptanceResult.from_histogram([2, 3, 4, 1], num_prompts=1, num_tokens=30)
    assert r.acceptance == pytest.approx([0.8, 0.5, 0.1])
    assert r.mean_acceptance_length == pytest.approx(1 + 0.8 + 0.5 + 0.1)
    assert r.num_spec_steps == 10 and r.k == 3
    merged = AcceptanceResult.merge([r, AcceptanceResult.from_histogram([8, 0, 0, 0], num_prompts=2, num_tokens=8)])
    assert merged.histogram == [10, 3, 4, 1] and merged.num_prompts == 3 and merged.num_tokens == 38
    empty = AcceptanceResult.of_details([], k=2)  # core.acceptance's one empty case: no step, no MAL
    assert empty.acceptance == [0.0, 0.0] and empty.mean_acceptance_length is None and empty.histogram == [0, 0, 0]


def test_chat_prompt_ids_renders_a_conversation(verifier_model):
    _, tok = verifier_model
    one = chat_prompt_ids(tok, "Bonjour")
    conv = chat_prompt_ids(tok, [{"role": "user", "content": "Bonjour"}, {"role": "assistant", "content": "Salut !"},
                                 {"role": "user", "content": "Ça va ?"}])
    assert one == chat_prompt_ids(tok, [{"role": "user", "content": "Bonjour"}])
    assert len(conv) > len(one) and "Salut !" in tok.decode(conv)


def test_bad_arguments(verifier_model, trained_draft):
    model, tok = verifier_model
    with pytest.raises(AcceptanceError):
        OfflineSpeculator(model, tok, trained_draft, k=0)
    with pytest.raises(AcceptanceError):
        measure_acceptance_models(model, tok, trained_draft, [], k=K)


def test_output_is_the_verifiers_greedy_answer(verifier_model, base_draft_dir, verifier):
    """Speculation never changes what greedy decoding says, whatever the draft proposes."""
    model, tok = verifier_model
    draft = load_draft(base_draft_dir, verifier.path)
    prompts = ["What is the capital of France?", "Name three colours."]
    res = measure_acceptance_models(model, tok, draft, prompts, k=K, max_new_tokens=24, progress=False)
    for prompt, detail in zip(prompts, res.details, strict=True):
        ids = torch.tensor([chat_prompt_ids(tok, prompt)])
        with torch.inference_mode():
            greedy = model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :].tolist()
        assert detail.output_ids == greedy
    assert res.num_tokens == sum(len(d.output_ids) for d in res.details)
    assert sum(res.histogram) == res.num_spec_steps > 0


def test_chain_matches_speculators_teacher_forced_forward(verifier_model, trained_draft):
    """Every draft the KV-cached chain proposed after an all-accepted prefix equals what speculators'
    own training forward (TTT steps over the final sequence) predicts at that position."""
    model, tok = verifier_model
    prompts = [p.text for p in load_mtbench(["en"], limit=3)["en"]]
    res = measure_acceptance_models(model, tok, trained_draft, prompts, k=K, max_new_tokens=48, progress=False)
    assert sum(res.histogram[1:]) >= 3, res  # the trained draft gets drafts accepted: later chain steps are checked too
    compared = agreed = 0
    for prompt, detail in zip(prompts, res.details, strict=True):
        seq = chat_prompt_ids(tok, prompt) + detail.output_ids
        aux, _ = capture_hidden_states(model, seq, trained_draft.config.eagle_aux_hidden_state_layer_ids)
        t = len(seq)
        with torch.inference_mode():
            ttt = trained_draft(
                hidden_states=aux[:-1].reshape(1, t - 1, -1), input_ids=torch.tensor([seq[1:]]),
                document_ids=torch.zeros(1, t - 1, dtype=torch.long), ttt_steps=K,
            )
        d2t = trained_draft.d2t
        for first_pos, drafts, accepted in detail.steps:
            index = first_pos - 2  # the pair (token[first_pos - 1], aux[first_pos - 2]) predicts first_pos
            for j in range(min(accepted + 1, K)):
                if first_pos - 1 + j >= t:  # the sequence was cut (token budget) before this draft's input
                    break
                want = int(ttt[j][0, index]) + int(d2t[int(ttt[j][0, index])])
                compared += 1
                agreed += drafts[j] == want
    assert compared > 40
    assert agreed / compared >= 0.98, (agreed, compared)  # fp32 cached vs full-sequence kernels: rare near-ties


def test_hidden_state_conventions_and_batching(verifier_model):
    """aux layer L = output_hidden_states[L]; `last` is pre-norm (norm(last) gives the logits);
    the batched, padded capture equals the one-by-one capture."""
    from polyspec.models.hidden import HiddenStateError, capture_hidden_states_batched

    model, tok = verifier_model
    seqs = [chat_prompt_ids(tok, p) for p in ("Hi", "Explain photosynthesis in one sentence.", "2+2?")]
    aux, last = capture_hidden_states(model, seqs[1], [2, 15, 27])
    with torch.inference_mode():
        out = model(torch.tensor([seqs[1]]), output_hidden_states=True)
        assert torch.equal(aux[:, 1], out.hidden_states[15][0])
        assert torch.allclose(model.lm_head(model.model.norm(last)), out.logits[0], atol=1e-4)
        assert not torch.allclose(last, out.hidden_states[-1][0])  # transformers' last entry is post-norm
    batched = {i: (a, b) for i, a, b in capture_hidden_states_batched(model, seqs, [2, 15, 27], max_batch_tokens=64)}
    for i, s in enumerate(seqs):
        a, b = capture_hidden_states(model, s, [2, 15, 27])
        assert torch.allclose(batched[i][0], a, atol=1e-4) and torch.allclose(batched[i][1], b, atol=1e-4)
    with pytest.raises(HiddenStateError):
        capture_hidden_states(model, seqs[0], [2, 31])
