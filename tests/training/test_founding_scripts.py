"""scripts/founding_experiment.py and scripts/founding_results.py: the arithmetic and choices behind docs/results.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import founding_experiment as fx  # noqa: E402
import founding_results as fr  # noqa: E402

DATA, BASE = ROOT / "data", ROOT / "models" / "drafts" / "smollm2-135m-instruct-en"


def test_mean_acceptance_length_pools_steps_over_prompts():
    # 3 steps accepting 0, 1 and 3 drafts, then 1 step accepting 2: (0 + 1 + 3 + 2) / 4 = 1.5 accepted per step
    assert fx.pooled_mal([[1, 1, 0, 1], [0, 0, 1, 0]]) == pytest.approx(2.5)
    assert fx.pooled_mal([]) is None and fx.pooled_mal([[0, 0, 0, 0]]) is None  # core.acceptance's empty case


def test_evaluation_groups_come_from_the_files_given(tmp_path, monkeypatch):
    """No language list in the script: groups are the languages of the benchmark and code files."""
    code = tmp_path / "code_heldout.jsonl"
    code.write_text('{"id": "he-xx-70", "lang": "sw", "domain": "code", "prompt": "def f():"}\n'
                    '{"id": "he-fr-71", "lang": "fr", "domain": "code", "prompt": "def g():"}\n')
    monkeypatch.setenv("FX_LIMIT", "3")
    groups = fx.eval_items(["mtbench:fr", "mtbench:ko"], code)
    assert set(groups) == {"mt-fr", "mt-ko", "code-sw", "code-fr"}
    assert [it.key for it in groups["mt-fr"]][:2] == ["mtbench-fr-81-t1", "mtbench-fr-81-t2"]
    assert len(groups["mt-fr"]) == 6  # 3 questions x 2 turns


def test_acceptance_row_matches_the_registry_contract():
    row = fr.acceptance_row([[1, 1, 0, 1], [0, 0, 1, 0]], "mtbench", "fr", 40)
    assert row["acceptance"] == pytest.approx([3 / 4, 2 / 4, 1 / 4])  # P(at least i+1 accepted)
    assert row["mean_acceptance_length"] == pytest.approx(1 + sum(row["acceptance"]))
    assert row["k"] == 3 and row["num_prompts"] == 2 and row["details"]["histogram"] == [1, 1, 1, 1]
    assert fr.acceptance_row([[2, 0, 0, 0]], "humaneval-xl-heldout", "de", 3)["domain"] == "code"


def _eval_file(path: Path, mal_by_draft: dict[str, dict[str, int]]) -> Path:
    """An evaluation file whose drafts accept ``n`` drafts at every step of one prompt per group."""
    def hist(n: int) -> list[list[int]]:
        return [[10 if a == n else 0 for a in range(4)]]
    drafts = {name: {"groups": {g: {"hist": hist(n), "hist96": hist(n)} for g, n in groups.items()}}
              for name, groups in mal_by_draft.items()}
    path.write_text(json.dumps({"groups": {}, "drafts": drafts}))
    return path


def test_pick_ships_the_best_run_per_language_only_where_it_beats_the_base(tmp_path):
    ev = _eval_file(tmp_path / "eval.json", {
        "base": {"mt-fr": 1, "mt-de": 1, "mt-ja": 2, "code-fr": 0},
        "fr-founding": {"mt-fr": 2}, "fr-more-8ep": {"mt-fr": 3},   # the better French run wins
        "de-founding": {"mt-de": 1},                                  # ties the base: not shipped
        "ja-ft": {"mt-ja": 1}, "ja-scratch": {"mt-ja": 3},
        "code": {"code-fr": 2},
        "broken": {},
    })
    assert fx.pick([ev], DATA, BASE) == ["fr-more-8ep", "ja-scratch", "code"]


def test_every_spec_builds_a_valid_run_config_and_reuse_targets_exist():
    from polyspec.training.config import RunConfig

    specs = fx.run_specs(DATA, BASE)
    for name, spec in specs.items():
        spec = dict(spec)
        reuse = spec.pop("reuse", None)
        assert reuse is None or reuse in specs
        RunConfig(run_id=name, verifier="smollm2-135m-instruct", seed=0, device="cuda", answers=fx.ANSWERS,
                  hidden=fx.HIDDEN, registration={"enabled": False}, **spec)


def test_the_walk_cut_to_a_smaller_budget_keeps_its_first_steps():
    class Detail:
        histogram = [0, 0, 0, 0]
        steps = [(0, 0, 3), (4, 0, 3), (8, 0, 0), (9, 0, 2)]  # (position, _, accepted)
    # 1 + 4 + 4 = 9 tokens after two steps; the third step would pass a budget of 9
    assert fx._cut(Detail(), 9) == [0, 0, 0, 2]
    assert fx._cut(Detail(), 96) == [1, 0, 1, 2]
