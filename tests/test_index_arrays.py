"""The vectorised index chain equals the scalar one exactly: mixing ranges, batched permutations, slices.

The references (tests/index_references.py) are the scalar functions composed one position at a time (the
code ``examples_at`` and ``read_runs`` ran before they were vectorised), so every property compares two
implementations.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.index import (
    BatchSchedule,
    EpochPermutation,
    ExampleArrays,
    ExampleRef,
    Mixing,
    PlanError,
    ReadRun,
    RunPlan,
    assign,
    example_arrays,
    examples_at,
    global_batch,
    permute_many,
    read_runs,
)
from taskdata.index.permutation import permute_blocks
from taskdata.index.tables import ShardFinder
from tests.index_references import (
    make_plan,
    plans,
    reference_assign,
    reference_examples,
    reference_runs,
    steps,
)


@given(plan=plans(), step=steps, hosts=st.sampled_from([1, 2, 4, 8]), data=st.data())
@settings(max_examples=150, deadline=None)
def test_assign_equals_the_scalar_chain(plan: RunPlan, step: int, hosts: int, data: st.DataObject) -> None:
    if plan.skip and data.draw(st.booleans()):
        step = plan.skip[0].start + data.draw(st.integers(0, plan.skip[0].stop - plan.skip[0].start))
    host = data.draw(st.integers(0, hosts - 1))
    got = assign(plan, step, host, hosts)
    assert got == reference_assign(plan, step, host, hosts)
    assert read_runs(got.examples) == got.runs


@given(plan=plans(), step=steps)
@settings(max_examples=60, deadline=None)
def test_global_batch_and_examples_at_equal_the_scalar_chain(plan: RunPlan, step: int) -> None:
    positions = plan.schedule.positions(step)
    expected = reference_examples(plan, positions)
    assert examples_at(plan, positions) == expected
    assert global_batch(plan, step) == (() if plan.is_skipped(step) else expected)
    # Any contiguous sub-range, including empty ones, and ranges that are not contiguous.
    assert examples_at(plan, positions[3:-2]) == expected[3:-2]
    assert examples_at(plan, positions[::3]) == expected[::3]
    assert examples_at(plan, range(positions.start, positions.start)) == ()


@given(plan=plans(), step=steps)
@settings(max_examples=60, deadline=None)
def test_per_task_runs_equal_read_runs_of_each_task_alone(plan: RunPlan, step: int) -> None:
    positions = plan.schedule.positions(step)
    arrays = example_arrays(plan, positions)
    examples = reference_examples(plan, positions)
    for task, name in enumerate(plan.task_names):
        tasks, shards, firsts, counts = arrays.runs(task)
        got = [
            ReadRun(plan.task_names[t], s, f, c)
            for t, s, f, c in zip(tasks, shards, firsts, counts, strict=True)
        ]
        assert tuple(got) == reference_runs(tuple(e for e in examples if e.task == name))
    # Every part (data shard) and task at once, as the server cuts a step: equal to each part alone.
    third = len(arrays) // 3
    part = arrays.cut(third, len(arrays) - third)
    assert part.positions == range(positions.start + third, positions.stop - third)
    assert part.records.tolist() == arrays.records[third : len(arrays) - third].tolist()
    num_tasks = len(plan.task_names)
    for num_parts in sorted({1, 2, 3, plan.num_data_shards}):
        if len(arrays) % num_parts:
            continue
        bounds, shards, firsts, counts = arrays.grouped_runs(num_parts, num_tasks)
        size = len(arrays) // num_parts
        for p in range(num_parts):
            for task in range(num_tasks):
                a, b = bounds[p * num_tasks + task], bounds[p * num_tasks + task + 1]
                alone = arrays.cut(p * size, (p + 1) * size).runs(task)[1:]
                got = (shards[a:b], firsts[a:b], counts[a:b])
                assert [x.tolist() for x in got] == [x.tolist() for x in alone], (num_parts, p, task)


def test_grouped_runs_need_equal_parts() -> None:
    plan = make_plan({"c4": (1000,) * 4}, schedule=BatchSchedule.constant(512), num_data_shards=4)
    arrays = example_arrays(plan, plan.schedule.positions(1))
    with pytest.raises(PlanError, match="512 examples cannot be cut into 3 equal parts"):
        arrays.grouped_runs(3, 1)


def test_read_runs_of_a_single_task_in_epoch_zero_are_long() -> None:
    plan = make_plan({"c4": (1000,) * 4}, schedule=BatchSchedule.constant(512), num_data_shards=4)
    assert assign(plan, 1, 3).runs == (ReadRun("c4", 0, 896, 104), ReadRun("c4", 1, 0, 24))
    arrays = example_arrays(plan, plan.schedule.positions(1))
    assert [a.tolist() for a in arrays.runs()] == [[0, 0], [0, 1], [512, 0], [488, 24]]


weights = st.one_of(st.integers(1, 20), st.sampled_from([999, 10**6, 10**12, 10**18]), st.integers(1, 10**9))
starts = st.one_of(
    st.integers(0, 10**6),
    st.integers(0, 10**15),
    st.integers(2**62, 2**63 + 2**20),  # int64 positions near their limit, and Python ints past it
)


@given(weights=st.lists(weights, min_size=1, max_size=6), start=starts, length=st.integers(0, 400))
@settings(max_examples=200, deadline=None)
def test_locate_range_equals_locate(weights: list[int], start: int, length: int) -> None:
    mixing = Mixing.from_rates(weights)
    tasks, task_positions = mixing.locate_range(start, start + length)
    assert tasks.dtype == np.int64
    assert list(zip(tasks.tolist(), task_positions.tolist(), strict=True)) == [
        mixing.locate(p) for p in range(start, start + length)
    ]


@pytest.mark.parametrize("method", ["locate_range", "tasks_in_range"])
def test_locate_range_checks_its_bounds(method: str) -> None:
    with pytest.raises(PlanError, match="A position range must have start <= stop but got start=5, stop=4"):
        getattr(Mixing((1, 2)), method)(5, 4)
    with pytest.raises(PlanError, match="A stream position must be an integer >= 0 but got -1"):
        getattr(Mixing((1, 2)), method)(-1, 4)


sizes = st.one_of(
    st.integers(1, 300),
    st.integers(1, 2**31),
    st.sampled_from([2, 3, 4, 5, 2**30, 2**30 + 1, 2**60 - 1, 2**60, 2**60 + 1, 2**62 + 3, 2**63 - 1, 2**63]),
    st.integers(1, 2**63),
)


@given(
    permutations=st.lists(st.tuples(sizes, st.integers(0, 2**64 - 1)), min_size=1, max_size=5),
    count=st.sampled_from([1, 5, 16, 17, 60, 300]),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=150, deadline=None)
def test_permute_many_equals_each_permutation(
    permutations: list[tuple[int, int]], count: int, seed: int
) -> None:
    # Batches above and below the size at which the last walks finish one at a time; indices drawn
    # by a seeded generator (hypothesis draws them slowly), the first and last of each range included.
    perms = [EpochPermutation(size, key) for size, key in permutations]
    rng = random.Random(seed)
    which = [rng.randrange(len(perms)) for _ in range(count)]
    indices = [rng.choice([0, perms[w].size - 1, rng.randrange(perms[w].size)]) for w in which]
    got = permute_many(perms, np.array(which), np.array(indices, dtype=np.int64))
    assert got.dtype == np.int64
    assert got.tolist() == [perms[w](i) for w, i in zip(which, indices, strict=True)]


@given(
    permutations=st.lists(st.tuples(sizes, st.integers(0, 2**64 - 1)), min_size=1, max_size=5),
    lengths=st.lists(st.sampled_from([0, 1, 5, 17, 300]), min_size=5, max_size=5),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=150, deadline=None)
def test_permute_blocks_equals_permute_many(
    permutations: list[tuple[int, int]], lengths: list[int], seed: int
) -> None:
    # Sizes up to 2**24 take the round tables, larger ones permute_many itself; sizes just above a power of
    # two walk (both in the tables and one at a time).
    perms = [EpochPermutation(size, key) for size, key in permutations]
    lengths = lengths[: len(perms)]
    rng = random.Random(seed)
    indices = [
        rng.choice([0, p.size - 1, rng.randrange(p.size)]) for p, n in zip(perms, lengths, strict=True) for _ in range(n)
    ]
    got = permute_blocks(perms, lengths, np.array(indices, dtype=np.int64))
    assert got.dtype == np.int64
    which = np.repeat(np.arange(len(perms)), lengths)
    assert got.tolist() == permute_many(perms, which, np.array(indices, dtype=np.int64)).tolist()


def test_permute_blocks_walks_like_the_scalar_code() -> None:
    epochs_and_sizes = ((1, 1025), (2, 129), (3, 1), (4, 2**24))
    perms = [EpochPermutation.for_epoch(9, "t", epoch, size) for epoch, size in epochs_and_sizes]
    lengths = [1025, 129, 1, 3]
    indices = np.concatenate([np.arange(1025), np.arange(129), [0], [0, 5, 2**24 - 1]])
    got = permute_blocks(perms, lengths, indices)
    which = np.repeat(np.arange(4), lengths)
    assert got.tolist() == [perms[w](i) for w, i in zip(which.tolist(), indices.tolist(), strict=True)]
    assert sorted(got[:1025].tolist()) == list(range(1025))


def test_permute_many_walks_whole_permutations_like_the_scalar_code() -> None:
    # Sizes just above a power of two make almost half of all encryptions walk, some of them far.
    perms = [EpochPermutation.for_epoch(9, "t", epoch, size) for epoch, size in ((1, 1025), (2, 129), (3, 1))]
    which = np.repeat([0, 1, 2], [1025, 129, 1])
    indices = np.concatenate([np.arange(1025), np.arange(129), [0]])
    got = permute_many(perms, which, indices)
    assert got.tolist() == [perms[w](i) for w, i in zip(which.tolist(), indices.tolist(), strict=True)]
    assert sorted(got[:1025].tolist()) == list(range(1025))
    # Negative control: another epoch is another order.
    other = permute_many([EpochPermutation.for_epoch(9, "t", 4, 1025)], np.zeros(1025, int), np.arange(1025))
    assert other.tolist() != got[:1025].tolist()


def test_permute_many_names_bad_input() -> None:
    perm = EpochPermutation(10, 3)
    with pytest.raises(PlanError, match=r"Index must be an integer in \[0, 10\) but got 10"):
        permute_many([perm], np.array([0, 0]), np.array([3, 10]))
    with pytest.raises(PlanError, match=r"every entry of which must be in \[0, 1\) .* from 0 to 1"):
        permute_many([perm], np.array([0, 1]), np.array([3, 4]))
    with pytest.raises(PlanError, match=r"two 1-D arrays of one length but got shapes \(2,\) and \(1,\)"):
        permute_many([perm], np.array([0, 0]), np.array([3]))
    with pytest.raises(PlanError, match="at most 2\\*\\*63 elements, but got one of 9223372036854775809"):
        permute_many([EpochPermutation(2**63 + 1, 3)], np.array([0]), np.array([3]))
    assert permute_many([perm], np.array([], int), np.array([], int)).tolist() == []


@pytest.mark.parametrize(
    ("counts", "batch", "step", "epochs"),
    [
        # Positions just below 2**63 (int64 arrays), then a slice that ends at 2**63 (scalar fallback).
        ({"a": (7, 5), "b": (3,)}, 2**10, 2**53 - 2, None),
        ({"a": (7, 5), "b": (3,)}, 2**10, 2**53 - 1, None),
        # Epoch 2 of 2**60 records: the largest permutation the vector rounds take.
        ({"a": (2**59, 2**59)}, 64, 2**61 // 64 + 5, {2}),
        # Epoch 1 of 2**62 + 3 records: permute_many goes one by one.
        ({"a": (2**62, 3)}, 64, (2**62 + 2**40) // 64, {1}),
        # Both at once, in epochs 1 and 2 of a mixture.
        ({"a": (2**59, 2**59), "b": (2**60, 1)}, 64, 33 * 2**60 // 640, {1, 2}),
        # 2**63 records or more in all: the scalar fallback.
        ({"a": (2**62, 2**62), "b": (5,)}, 64, 10**9, None),
    ],
)
def test_extremes_equal_the_scalar_chain(
    counts: dict[str, tuple[int, ...]], batch: int, step: int, epochs: set[int] | None
) -> None:
    plan = make_plan(counts, schedule=BatchSchedule.constant(batch))
    for host in (0, 7):
        assert assign(plan, step, host) == reference_assign(plan, step, host, 8)
    if epochs is not None:  # the huge permutations are really reached
        assert {e.epoch for e in global_batch(plan, step)} == epochs


def test_epochs_past_the_first_follow_the_seed() -> None:
    plan = make_plan({"a": (40, 0, 27), "b": (13,)})
    other = make_plan({"a": (40, 0, 27), "b": (13,)}, seed=6)
    # The first 12 positions read epoch 0 of both tasks (the caches' own order); by 576 both are past it.
    assert examples_at(plan, range(12)) == examples_at(other, range(12))
    assert {e.epoch for e in examples_at(plan, range(12))} == {0}
    later, later_other = example_arrays(plan, range(576, 640)), example_arrays(other, range(576, 640))
    assert later.epochs.min() >= 1 and later.epochs.tolist() == later_other.epochs.tolist()
    assert later.indices.tolist() != later_other.indices.tolist()


def test_example_arrays_are_read_only_and_checked() -> None:
    plan = make_plan({"a": (4, 3), "b": (2,)})
    arrays = example_arrays(plan, range(10, 20))
    assert len(arrays) == 10 and arrays.positions == range(10, 20)
    with pytest.raises(ValueError, match="read-only"):
        arrays.records[0] = 1
    with pytest.raises(PlanError, match="ExampleArrays.shards must be a 1-D int64 array of length 2"):
        ExampleArrays(0, *(np.zeros(2, np.int64),) * 3, np.zeros(3, np.int64), np.zeros(2, np.int64))
    with pytest.raises(PlanError, match=r"range of step 1 .* but got range\(0, 10, 2\) .* Use examples_at"):
        example_arrays(plan, range(0, 10, 2))
    with pytest.raises(PlanError, match=r"range\(9223372036854775000, 9223372036854775808\)"):
        example_arrays(plan, range(2**63 - 808, 2**63))


def test_slices_of_every_host_count_make_up_the_same_global_batch() -> None:
    plan = make_plan(
        {"a": (400, 0, 270), "b": (13,), "c": (1,)}, schedule=BatchSchedule.ramp(16, 128, 50, multiple_of=8)
    )
    for step in (0, 7, 49, 50, 10**6):
        batch = global_batch(plan, step)
        for hosts in (1, 2, 4, 8):
            slices = [assign(plan, step, h, hosts).examples for h in range(hosts)]
            assert tuple(itertools.chain.from_iterable(slices)) == batch


@pytest.mark.parametrize("cls", [ExampleRef, ReadRun])
def test_hand_written_inits_take_exactly_the_fields(cls: type) -> None:
    fields = [f.name for f in dataclasses.fields(cls)]
    assert list(inspect.signature(cls).parameters) == fields
    values = list(range(len(fields)))
    made = cls(*values)
    assert made == cls(**dict(zip(fields, values, strict=True)))
    assert dataclasses.astuple(made) == tuple(values)
    assert made != cls(*values[:-1], -1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, fields[0], 5)


def test_a_mixture_of_many_tasks_equals_the_scalar_chain() -> None:
    # Deep trees whose nodes mostly hold a few positions of a slice, and many (task, epoch) pairs.
    caches = {f"t{i}": tuple(3 + (i * 37 + s) % 50 for s in range(1 + i % 4)) for i in range(60)}
    plan = make_plan(caches, rates={f"t{i}": (i * 7919) % 1000 + 1 for i in range(60)})
    for step in (0, 7, 10**6):
        for host in (0, 5):
            assert assign(plan, step, host) == reference_assign(plan, step, host, 8)


shard_counts = st.lists(
    st.lists(st.one_of(st.just(0), st.integers(1, 5), st.integers(1, 10**6)), min_size=1, max_size=30).filter(
        any
    ),
    min_size=1,
    max_size=3,
)


@given(counts_per_task=shard_counts, data=st.data())
@settings(max_examples=200, deadline=None)
def test_the_shard_finder_equals_a_binary_search(counts_per_task: list[list[int]], data: Any) -> None:
    finder = ShardFinder([np.array(c, np.int64) for c in counts_per_task])
    counts = np.array([c for task in counts_per_task for c in task], np.int64)
    ends = np.cumsum(counts)
    task_of_shard = np.repeat(np.arange(len(counts_per_task)), [len(c) for c in counts_per_task])
    picks = data.draw(st.lists(st.integers(0, int(ends[-1]) - 1), min_size=1, max_size=50))
    # Every shard's first and last record too: the boundaries are where an off-by-one would show.
    starts = ends - counts
    edges = [int(x) for s, e in zip(starts, ends, strict=True) if e > s for x in (s, e - 1)]
    indices = np.array(picks + edges, np.int64)
    expected = np.searchsorted(ends, indices, side="right")
    assert finder.find(indices, task_of_shard[expected]).tolist() == expected.tolist()


def test_the_shard_finder_takes_few_steps_on_even_layouts_and_falls_back_on_uneven_ones() -> None:
    rng = np.random.default_rng(0)
    # A big task of bucketed shards next to a small one with most of its shards empty, as in a mixture.
    small = np.zeros(65_536, np.int64)
    small[rng.choice(65_536, 1_000, replace=False)] = 1
    even = ShardFinder([rng.integers(900, 1_100, 65_536), small])
    assert even.span <= 3
    tasks = rng.integers(0, 2, 10_000)
    indices = np.where(
        tasks == 0,
        rng.integers(0, even.record_bases[1], 10_000),
        even.record_bases[1] + rng.integers(0, 1_000, 10_000),
    )
    assert (even.find(indices, tasks) == np.searchsorted(even.ends, indices, side="right")).all()
    uneven = ShardFinder([np.array([10**9] + [1] * 1000, np.int64)])
    assert uneven.span > ShardFinder.MAX_SPAN  # binary search then
    assert uneven.find(np.array([0, 10**9 - 1, 10**9, 10**9 + 999]), np.zeros(4, np.int64)).tolist() == [
        0,
        0,
        1,
        1000,
    ]
