"""The feistel epoch order: keyed Feistel permutations with cycle walking, task position <-> (epoch, index),
and many lookups at once (the mixer and the round tables) equal to one at a time."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.index import FEISTEL, PlanError
from taskdata.index.orders.feistel import FeistelPermutation, _mixer_many, _table_many

sizes = st.one_of(
    st.sampled_from([1, 2, 3, 5, 7, 13, 31, 127, 257, 8191, 4, 8, 16, 64, 1024, 4096, 1023, 1025]),
    st.integers(1, 3000),
)
seeds = st.integers(0, 2**63 - 1)


@given(size=sizes, seed=seeds, epoch=st.integers(1, 10**6))
@settings(max_examples=150, deadline=None)
def test_each_epoch_is_a_bijection_and_the_inverse_inverts(size: int, seed: int, epoch: int) -> None:
    permutation = FEISTEL.permutation(seed, "c4_span_corruption", epoch, size)
    image = [permutation(i) for i in range(size)]
    assert sorted(image) == list(range(size))
    assert [permutation.inverse(j) for j in image] == list(range(size))


@given(size=st.integers(16, 3000), seed=seeds)
@settings(max_examples=60, deadline=None, derandomize=True)
def test_different_seed_gives_a_different_order(size: int, seed: int) -> None:
    first = FEISTEL.permutation(seed, "task", 1, size)
    other = FEISTEL.permutation(seed ^ 1, "task", 1, size)
    assert [first(i) for i in range(size)] != [other(i) for i in range(size)]


@given(size=st.integers(16, 3000), seed=seeds, epoch=st.integers(1, 1000))
@settings(max_examples=60, deadline=None, derandomize=True)
def test_no_epoch_repeats_the_previous_order(size: int, seed: int, epoch: int) -> None:
    def order(e: int) -> list[int]:
        return [FEISTEL.epoch_and_index(seed, "task", size, e * size + i)[1] for i in range(size)]

    assert order(epoch) != order(epoch - 1)  # for epoch 1 that is the stored order of epoch 0


def test_the_task_name_keys_the_order() -> None:
    a = FEISTEL.permutation(7, "task_a", 1, 100)
    b = FEISTEL.permutation(7, "task_b", 1, 100)
    assert [a(i) for i in range(100)] != [b(i) for i in range(100)]


def test_pinned_order_of_a_small_permutation() -> None:
    # Changing these values changes every run's data: bump INDEX_MATH_VERSION if you must.
    permutation = FEISTEL.permutation(1, "t", 1, 10)
    assert [permutation(i) for i in range(10)] == [4, 5, 1, 8, 9, 2, 6, 3, 7, 0]


@pytest.mark.parametrize("size", [10**12, 2**40, 2**40 + 1, 3 * 10**9 + 7])
def test_huge_sizes_stay_in_range_and_invert(size: int) -> None:
    permutation = FEISTEL.permutation(3, "big", 2, size)
    for i in (0, 1, size // 3, size - 2, size - 1):
        j = permutation(i)
        assert 0 <= j < size
        assert permutation.inverse(j) == i


@given(size=sizes, seed=seeds, epochs=st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_task_positions_cover_every_index_once_per_epoch(size: int, seed: int, epochs: int) -> None:
    seen: dict[int, list[int]] = {}
    for position in range(epochs * size):
        epoch, index = FEISTEL.epoch_and_index(seed, "task", size, position)
        seen.setdefault(epoch, []).append(index)
        assert FEISTEL.task_position(seed, "task", size, epoch, index) == position
    assert seen[0] == list(range(size))  # epoch 0 is the cache's stored (already shuffled) order
    assert all(sorted(indices) == list(range(size)) for indices in seen.values())
    assert sorted(seen) == list(range(epochs))


def test_invalid_arguments_are_named() -> None:
    with pytest.raises(PlanError, match="A permutation size must be a positive integer but got 0"):
        FeistelPermutation(size=0, key=1)
    with pytest.raises(PlanError, match=r"Only epochs >= 1 are permuted \(epoch 0 is stored order\)"):
        FEISTEL.permutation(1, "t", 0, 10)
    with pytest.raises(PlanError, match=r"Index must be an integer in \[0, 10\) but got 10"):
        FEISTEL.permutation(1, "t", 1, 10)(10)
    with pytest.raises(PlanError, match=r"Record index must be an integer in \[0, 10\) but got -1"):
        FEISTEL.task_position(1, "t", 10, 0, -1)


many_sizes = st.one_of(
    st.integers(1, 300),
    st.integers(1, 2**31),
    st.sampled_from([2, 3, 4, 5, 2**30, 2**30 + 1, 2**60 - 1, 2**60, 2**60 + 1, 2**62 + 3, 2**63 - 1, 2**63]),
    st.integers(1, 2**63),
)


@given(
    permutations=st.lists(st.tuples(many_sizes, st.integers(0, 2**64 - 1)), min_size=1, max_size=5),
    count=st.sampled_from([1, 5, 16, 17, 60, 300]),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=150, deadline=None)
def test_permute_many_equals_each_permutation(
    permutations: list[tuple[int, int]], count: int, seed: int
) -> None:
    # Batches above and below the size at which the last walks finish one at a time; indices drawn
    # by a seeded generator (hypothesis draws them slowly), the first and last of each range included.
    perms = [FeistelPermutation(size, key) for size, key in permutations]
    rng = random.Random(seed)
    which = [rng.randrange(len(perms)) for _ in range(count)]
    indices = [rng.choice([0, perms[w].size - 1, rng.randrange(perms[w].size)]) for w in which]
    got = FEISTEL.permute_many(perms, np.array(which), np.array(indices, dtype=np.int64))
    assert got.dtype == np.int64
    assert got.tolist() == [perms[w](i) for w, i in zip(which, indices, strict=True)]


@given(
    permutations=st.lists(st.tuples(many_sizes, st.integers(0, 2**64 - 1)), min_size=1, max_size=5),
    lengths=st.lists(st.sampled_from([0, 1, 5, 17, 300]), min_size=5, max_size=5),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=150, deadline=None)
def test_the_round_tables_equal_the_mixer(
    permutations: list[tuple[int, int]], lengths: list[int], seed: int
) -> None:
    # Sizes up to 2**24 take the round tables in FEISTEL.apply (larger ones the mixer); sizes just above a
    # power of two walk (both in the tables and one at a time).
    perms = [FeistelPermutation(size, key) for size, key in permutations]
    lengths = lengths[: len(perms)]
    rng = random.Random(seed)
    indices = [
        rng.choice([0, p.size - 1, rng.randrange(p.size)]) for p, n in zip(perms, lengths, strict=True) for _ in range(n)
    ]
    which = np.repeat(np.arange(len(perms)), lengths)
    got = FEISTEL.permute_many(perms, which, np.array(indices, dtype=np.int64))
    assert got.dtype == np.int64
    if len(indices) and max(p.size for p in perms) <= 2**60:
        assert got.tolist() == _mixer_many(perms, which, np.array(indices, dtype=np.int64)).tolist()
    if max(p._bits for p in perms) <= 24 and len(indices):
        width = 1 << (max(p._bits for p in perms) + 1) // 2
        table = _table_many(perms, which, np.array(indices, dtype=np.int64), width)
        assert table.tolist() == got.tolist()


def test_the_round_tables_walk_like_the_scalar_code() -> None:
    epochs_and_sizes = ((1, 1025), (2, 129), (3, 1), (4, 2**24))
    perms = [FEISTEL.permutation(9, "t", epoch, size) for epoch, size in epochs_and_sizes]
    lengths = [1025, 129, 1, 3]
    indices = np.concatenate([np.arange(1025), np.arange(129), [0], [0, 5, 2**24 - 1]])
    which = np.repeat(np.arange(4), lengths)
    got = _table_many(perms, which, indices, 1 << 12)
    assert got.tolist() == [perms[w](i) for w, i in zip(which.tolist(), indices.tolist(), strict=True)]
    assert sorted(got[:1025].tolist()) == list(range(1025))


def test_the_mixer_walks_whole_permutations_like_the_scalar_code() -> None:
    # Sizes just above a power of two make almost half of all encryptions walk, some of them far.
    perms = [FEISTEL.permutation(9, "t", epoch, size) for epoch, size in ((1, 1025), (2, 129), (3, 1))]
    which = np.repeat([0, 1, 2], [1025, 129, 1])
    indices = np.concatenate([np.arange(1025), np.arange(129), [0]])
    got = _mixer_many(perms, which, indices)
    assert got.tolist() == [perms[w](i) for w, i in zip(which.tolist(), indices.tolist(), strict=True)]
    assert sorted(got[:1025].tolist()) == list(range(1025))
    # Negative control: another epoch is another order.
    other = FEISTEL.permute_many([FEISTEL.permutation(9, "t", 4, 1025)], np.zeros(1025, int), np.arange(1025))
    assert other.tolist() != got[:1025].tolist()


def test_permute_many_names_bad_input() -> None:
    perm = FeistelPermutation(10, 3)
    with pytest.raises(PlanError, match=r"Index must be an integer in \[0, 10\) but got 10"):
        FEISTEL.permute_many([perm], np.array([0, 0]), np.array([3, 10]))
    with pytest.raises(PlanError, match=r"every entry of which must be in \[0, 1\) .* from 0 to 1"):
        FEISTEL.permute_many([perm], np.array([0, 1]), np.array([3, 4]))
    with pytest.raises(PlanError, match=r"two 1-D arrays of one length but got shapes \(2,\) and \(1,\)"):
        FEISTEL.permute_many([perm], np.array([0, 0]), np.array([3]))
    with pytest.raises(PlanError, match="at most 2\\*\\*63 elements, but got one of 9223372036854775809"):
        FEISTEL.permute_many([FeistelPermutation(2**63 + 1, 3)], np.array([0]), np.array([3]))
    assert FEISTEL.permute_many([perm], np.array([], int), np.array([], int)).tolist() == []
