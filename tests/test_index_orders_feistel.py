"""Epoch order: keyed Feistel permutations with cycle walking, and task position <-> (epoch, index)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.index import EpochPermutation, PlanError, epoch_and_index, task_position_of

sizes = st.one_of(
    st.sampled_from([1, 2, 3, 5, 7, 13, 31, 127, 257, 8191, 4, 8, 16, 64, 1024, 4096, 1023, 1025]),
    st.integers(1, 3000),
)
seeds = st.integers(0, 2**63 - 1)


@given(size=sizes, seed=seeds, epoch=st.integers(1, 10**6))
@settings(max_examples=150, deadline=None)
def test_each_epoch_is_a_bijection_and_the_inverse_inverts(size: int, seed: int, epoch: int) -> None:
    permutation = EpochPermutation.for_epoch(seed, "c4_span_corruption", epoch, size)
    image = [permutation(i) for i in range(size)]
    assert sorted(image) == list(range(size))
    assert [permutation.inverse(j) for j in image] == list(range(size))


@given(size=st.integers(16, 3000), seed=seeds)
@settings(max_examples=60, deadline=None, derandomize=True)
def test_different_seed_gives_a_different_order(size: int, seed: int) -> None:
    first = EpochPermutation.for_epoch(seed, "task", 1, size)
    other = EpochPermutation.for_epoch(seed ^ 1, "task", 1, size)
    assert [first(i) for i in range(size)] != [other(i) for i in range(size)]


@given(size=st.integers(16, 3000), seed=seeds, epoch=st.integers(1, 1000))
@settings(max_examples=60, deadline=None, derandomize=True)
def test_no_epoch_repeats_the_previous_order(size: int, seed: int, epoch: int) -> None:
    def order(e: int) -> list[int]:
        return [epoch_and_index(seed, "task", size, e * size + i)[1] for i in range(size)]

    assert order(epoch) != order(epoch - 1)  # for epoch 1 that is the stored order of epoch 0


def test_the_task_name_keys_the_order() -> None:
    a = EpochPermutation.for_epoch(7, "task_a", 1, 100)
    b = EpochPermutation.for_epoch(7, "task_b", 1, 100)
    assert [a(i) for i in range(100)] != [b(i) for i in range(100)]


def test_pinned_order_of_a_small_permutation() -> None:
    # Changing these values changes every run's data: bump INDEX_MATH_VERSION if you must.
    permutation = EpochPermutation.for_epoch(1, "t", 1, 10)
    assert [permutation(i) for i in range(10)] == [4, 5, 1, 8, 9, 2, 6, 3, 7, 0]


@pytest.mark.parametrize("size", [10**12, 2**40, 2**40 + 1, 3 * 10**9 + 7])
def test_huge_sizes_stay_in_range_and_invert(size: int) -> None:
    permutation = EpochPermutation.for_epoch(3, "big", 2, size)
    for i in (0, 1, size // 3, size - 2, size - 1):
        j = permutation(i)
        assert 0 <= j < size
        assert permutation.inverse(j) == i


@given(size=sizes, seed=seeds, epochs=st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_task_positions_cover_every_index_once_per_epoch(size: int, seed: int, epochs: int) -> None:
    seen: dict[int, list[int]] = {}
    for position in range(epochs * size):
        epoch, index = epoch_and_index(seed, "task", size, position)
        seen.setdefault(epoch, []).append(index)
        assert task_position_of(seed, "task", size, epoch, index) == position
    assert seen[0] == list(range(size))  # epoch 0 is the cache's stored (already shuffled) order
    assert all(sorted(indices) == list(range(size)) for indices in seen.values())
    assert sorted(seen) == list(range(epochs))


def test_invalid_arguments_are_named() -> None:
    with pytest.raises(PlanError, match="A permutation size must be a positive integer but got 0"):
        EpochPermutation(size=0, key=1)
    with pytest.raises(PlanError, match=r"Only epochs >= 1 are permuted \(epoch 0 is stored order\)"):
        EpochPermutation.for_epoch(1, "t", 0, 10)
    with pytest.raises(PlanError, match=r"Index must be an integer in \[0, 10\) but got 10"):
        EpochPermutation.for_epoch(1, "t", 1, 10)(10)
    with pytest.raises(PlanError, match=r"Record index must be an integer in \[0, 10\) but got -1"):
        task_position_of(1, "t", 10, 0, -1)
