"""Length batches: every index exactly once, each budget held, and the CPU's padding cap."""

from __future__ import annotations

import random

import pytest

from polyspec.models.batching import CPU_MAX_PADDING, length_batches, max_padding_for

MTBENCH_IT = [57, 60, 69, 76, 76, 76, 81, 86, 90, 91, 102, 112, 118, 129, 297, 404]  # first turns, tokens


def padding(lengths: list[int], batch: list[int]) -> float:
    real = [lengths[i] for i in batch]
    return 1 - sum(real) / (len(real) * max(real))


def test_without_a_padding_cap_batches_fill_to_their_size_in_length_order() -> None:
    lengths = [5, 1, 9, 3, 7]
    assert list(length_batches(lengths, max_batch_size=2)) == [[2, 4], [0, 3], [1]]
    assert list(length_batches(lengths, max_batch_size=2, longest_first=False)) == [[1, 3], [0, 4], [2]]


def test_the_token_budget_counts_padded_slots_and_a_long_sequence_gets_its_own_batch() -> None:
    lengths = [10, 9, 8, 50]
    batches = list(length_batches(lengths, max_batch_size=8, max_batch_tokens=20))
    assert batches == [[3], [0, 1], [2]]  # 50 > 20 alone; 2 x 10 = 20 fits; a third row would be 30


def test_the_cpu_cap_splits_mtbench_where_one_batch_was_mostly_padding() -> None:
    assert padding(MTBENCH_IT, list(range(16))) > 0.7
    for longest_first in (True, False):
        batches = list(length_batches(MTBENCH_IT, max_batch_size=16, max_padding=CPU_MAX_PADDING,
                                      longest_first=longest_first))
        assert sorted(i for b in batches for i in b) == list(range(16))
        assert all(padding(MTBENCH_IT, b) <= CPU_MAX_PADDING for b in batches)
        assert sum(len(b) * max(MTBENCH_IT[i] for i in b) for b in batches) < 0.5 * 16 * 404


@pytest.mark.parametrize("seed", range(5))
def test_random_lengths_keep_every_budget(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 200))]
    batches = list(length_batches(lengths, max_batch_size=7, max_batch_tokens=600, max_padding=0.3))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 7
        assert len(b) == 1 or (len(b) * max(lengths[i] for i in b) <= 600 and padding(lengths, b) <= 0.3)


def test_the_cap_applies_on_cpu_only_and_a_bad_batch_size_is_refused() -> None:
    import torch

    assert max_padding_for("cpu") == max_padding_for(torch.device("cpu")) == CPU_MAX_PADDING
    assert max_padding_for("cuda:1") == max_padding_for(torch.device("cuda", 0)) == 1.0
    assert list(length_batches([], max_batch_size=4)) == []
    with pytest.raises(ValueError, match="max_batch_size"):
        list(length_batches([3], max_batch_size=0))
