"""The quality recipe's training data: decodings (greedy vs sampled), degenerate answers dropped, weighted prompt pools."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from polyspec.training.answers import answer_tokens, split_degenerate
from polyspec.training.decoding import GREEDY, SAMPLED, Decoding, DecodingError, generate, left_pad
from polyspec.training.prompt_pool import PoolError, provenance, read_pack_file, weight_of, weighted_order


def _row(prompt: list[int], answer: list[int], finished: bool) -> dict:
    return {"input_ids": prompt + answer, "num_prompt_tokens": len(prompt), "finished": finished,
            "loss_mask": [0] * len(prompt) + [1] * len(answer)}


def test_a_loop_is_dropped_and_prose_kept() -> None:
    loop = _row([1, 2], [7, 8, 9, 10] * 10 + [0], finished=True)
    prose = _row([1, 2], list(range(100, 140)) + [0], finished=True)
    kept, dropped = split_degenerate([loop, prose])
    assert kept == [prose] and dropped == [loop]
    assert answer_tokens(prose) == list(range(100, 140))  # the end-of-turn token is not part of the answer
    assert answer_tokens(_row([1], [5, 6], finished=False)) == [5, 6]  # cut by the budget: nothing to strip


def test_decoding_settings_are_checked() -> None:
    with pytest.raises(DecodingError, match="one answer per prompt"):
        Decoding(samples=2)
    with pytest.raises(DecodingError):
        Decoding(name="x", temperature=0.7, top_p=0.0)
    assert GREEDY.greedy and not SAMPLED.greedy and SAMPLED.repetition_penalty > 1
    with pytest.raises(DecodingError, match="at least one token"):
        left_pad([[1], []], 0)


def test_greedy_matches_the_serving_decoding_and_samples_come_per_prompt(verifier) -> None:
    import torch

    from polyspec.models.generation import generate_greedy
    from polyspec.models.hidden import load_verifier_model
    from polyspec.training.answers import template_prompt

    model, tok = load_verifier_model(verifier.path, device="cpu")
    prompts = [template_prompt(tok, [{"role": "user", "content": t}]) for t in ("What is 2+2?", "Name a colour.")]
    greedy = generate(model, tok, prompts, 6, GREEDY)
    assert [rows[0] for rows in greedy] == generate_greedy(model, tok, prompts, 6)
    torch.manual_seed(1)
    first = generate(model, tok, prompts, 6, Decoding("s", temperature=1.0, samples=3, repetition_penalty=1.2))
    torch.manual_seed(1)
    again = generate(model, tok, prompts, 6, Decoding("s", temperature=1.0, samples=3, repetition_penalty=1.2))
    assert [len(rows) for rows in first] == [3, 3] and first == again  # seeded: reproducible
    assert all(len(r) == 6 for rows in first for r in rows)


def _pack(path: Path, rows: list[dict], gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_pool_order_follows_source_weights_and_keeps_provenance(tmp_path: Path) -> None:
    ntrex = [{"id": f"n{i}", "prompt": f"news {i}", "domain": "general", "license": "CC-BY-SA-4.0",
              "source": "MicrosoftTranslator/NTREX@abc:x.txt"} for i in range(300)]
    ifeval = [{"id": f"m{i}", "prompt": f"do {i}", "domain": "general", "license": "Apache-2.0",
               "source": "lightblue-tech/M-IFEval@0bc3143:data/en_input_data.jsonl"} for i in range(300)]
    recs = read_pack_file(_pack(tmp_path / "en.jsonl.gz", ntrex + ifeval, gz=True))
    assert recs[0]["file"] == "en.jsonl.gz"
    order = weighted_order(recs, seed=3)
    assert order == weighted_order(recs, seed=3) and len(order) == 600  # deterministic, nothing lost
    first = Counter(r["source"].split("@")[0] for r in order[:100])
    assert first["lightblue-tech/M-IFEval"] > 5 * first["MicrosoftTranslator/NTREX"]  # weight 1.0 vs 0.1
    prov = provenance(order[:100])
    assert prov["prompts"] == 100 and sum(s["prompts"] for s in prov["sources"]) == 100
    assert set(prov["licenses"]) <= {"CC-BY-SA-4.0", "Apache-2.0"}
    assert weighted_order(recs, seed=3, weights={"MicrosoftTranslator/NTREX": 0.0})[-1]["id"].startswith("m")
    assert len(weighted_order(recs, 3, {"MicrosoftTranslator/NTREX": 0.0})) == 300  # weight 0: left out


def test_domain_refines_a_source_weight_and_bad_records_are_refused(tmp_path: Path) -> None:
    xq = "deepmind/xquad@60cac41:xquad.en.json"
    assert weight_of({"source": xq, "domain": "reading"}) < weight_of({"source": xq, "domain": "general"})
    assert weight_of({"source": "someone/else@1:f"}) == 0.5
    with pytest.raises(PoolError, match="has no prompt"):
        read_pack_file(_pack(tmp_path / "bad.jsonl", [{"id": "x", "prompt": ""}]))


def test_weighted_sample_is_unbiased_within_a_source() -> None:
    recs = [{"id": str(i), "prompt": "p", "source": "a/b@1:f"} for i in range(50)]
    firsts = Counter(weighted_order(recs, seed=s)[0]["id"] for s in range(2000))
    assert len(firsts) == 50 and max(firsts.values()) < 100  # equal weights: every record leads now and then
    assert random.Random(0).random() == random.Random(0).random()
