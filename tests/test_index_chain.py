"""The index chain computed as arrays equals it computed one position at a time, exactly, for every kind
of plan (mixtures, ramps, skips, huge and empty shards, many epochs, both epoch orders); ``task_extents``
equals the extents of each slice and task of ``example_arrays``.

The references (tests/index_references.py) are the links of the chain composed one position at a time (the
code ``examples_at`` and ``extents`` ran before they were vectorised), so every property compares two
implementations.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.index import (
    BatchSchedule,
    ExampleArrays,
    ExampleRef,
    Extent,
    PlanError,
    RunPlan,
    assign,
    example_arrays,
    examples_at,
    extents,
    fits_int64,
    global_batch,
)
from taskdata.index.chain import task_extents
from tests.index_references import (
    assert_task_extents_equal_example_arrays,
    make_plan,
    plans,
    reference_assign,
    reference_examples,
    reference_extents,
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
    assert extents(got.examples) == got.extents


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
def test_per_task_extents_equal_the_extents_of_each_task_alone(plan: RunPlan, step: int) -> None:
    positions = plan.schedule.positions(step)
    arrays = example_arrays(plan, positions)
    examples = reference_examples(plan, positions)
    for task, name in enumerate(plan.task_names):
        tasks, shards, firsts, counts = arrays.extents(task)
        got = [
            Extent(plan.task_names[t], s, f, c)
            for t, s, f, c in zip(tasks, shards, firsts, counts, strict=True)
        ]
        assert tuple(got) == reference_extents(tuple(e for e in examples if e.task == name))
    third = len(arrays) // 3
    part = arrays.cut(third, len(arrays) - third)
    assert part.positions == range(positions.start + third, positions.stop - third)
    assert part.records.tolist() == arrays.records[third : len(arrays) - third].tolist()


@given(plan=plans(), step=steps)
@settings(max_examples=80, deadline=None)
def test_task_extents_equal_the_extents_of_each_slice_and_task(plan: RunPlan, step: int) -> None:
    positions = plan.positions(step)
    if not fits_int64(plan, positions):
        return
    for parts in sorted({1, 2, 3, plan.num_data_shards}):
        if len(positions) % parts == 0:
            assert_task_extents_equal_example_arrays(plan, positions, parts)


def test_a_step_spanning_many_epochs_and_epoch_zero() -> None:
    # A 3-record task crosses an epoch every few positions; a big one starts in epoch 0 and leaves it.
    plan = make_plan({"tiny": (3,), "big": (40, 0, 25)}, num_data_shards=8)
    for step in (0, 1, 2, 7, 10**6):
        assert_task_extents_equal_example_arrays(plan, plan.positions(step), 8)
    assert_task_extents_equal_example_arrays(plan, range(50, 98), 1)


def test_empty_groups_have_no_extents() -> None:
    plan = make_plan({"a": (5,), "b": (7,)}, rates={"a": 1, "b": 1000})
    bounds, *_ = task_extents(plan, plan.positions(3), 8)
    assert np.diff(bounds)[:8].tolist().count(0) >= 7  # task a has at most one example in the step


def test_extents_of_a_single_task_in_epoch_zero_are_long() -> None:
    plan = make_plan({"c4": (1000,) * 4}, schedule=BatchSchedule.constant(512), num_data_shards=4)
    assert assign(plan, 1, 3).extents == (Extent("c4", 0, 896, 104), Extent("c4", 1, 0, 24))
    arrays = example_arrays(plan, plan.schedule.positions(1))
    assert [a.tolist() for a in arrays.extents()] == [[0, 0], [0, 1], [512, 0], [488, 24]]


@pytest.mark.parametrize(
    ("counts", "batch", "step", "epochs"),
    [
        # Positions just below 2**63 (int64 arrays), then a slice that ends at 2**63 (scalar fallback).
        ({"a": (7, 5), "b": (3,)}, 2**10, 2**53 - 2, None),
        ({"a": (7, 5), "b": (3,)}, 2**10, 2**53 - 1, None),
        # Epoch 2 of 2**60 records: the largest permutation the vector rounds take.
        ({"a": (2**59, 2**59)}, 64, 2**61 // 64 + 5, {2}),
        # Epoch 1 of 2**62 + 3 records: the permutations go one by one.
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


@pytest.mark.parametrize("cls", [ExampleRef, Extent])
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


