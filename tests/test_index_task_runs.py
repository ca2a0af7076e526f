"""``task_runs`` equals the per-position chain: the runs of every (task, slice) are ``cut(slice).runs(task)``
of ``example_arrays``, and the tasks are its tasks, for every kind of plan (and under the block order)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.index import EpochOrder, RunPlan, example_arrays
from taskdata.index.arrays import fits_int64
from taskdata.index.task_runs import task_runs
from tests.index_references import make_plan, plans, steps


def assert_equal_to_example_arrays(plan: RunPlan, positions: range, parts: int) -> None:
    arrays = example_arrays(plan, positions)
    bounds, shards, firsts, counts, tasks = task_runs(plan, positions, parts)
    assert tasks.tolist() == arrays.tasks.tolist()
    size = len(positions) // parts
    num_tasks = len(plan.task_names)
    assert len(bounds) == num_tasks * parts + 1 and bounds[-1] == len(shards)
    for task in range(num_tasks):
        for p in range(parts):
            a, b = bounds[task * parts + p], bounds[task * parts + p + 1]
            alone = arrays.cut(p * size, (p + 1) * size).runs(task)[1:]
            got = (shards[a:b], firsts[a:b], counts[a:b])
            assert [x.tolist() for x in got] == [x.tolist() for x in alone], (parts, p, task)


@given(plan=plans(), step=steps, block=st.sampled_from([None, 1, 3, 64]))
@settings(max_examples=80, deadline=None)
def test_task_runs_equal_the_runs_of_each_slice_and_task(plan: RunPlan, step: int, block: int | None) -> None:
    if block is not None:
        plan = dataclasses.replace(plan, epoch_order=EpochOrder.blocks(block))
    positions = plan.positions(step)
    if not fits_int64(plan, positions):
        return
    for parts in sorted({1, 2, 3, plan.num_data_shards}):
        if len(positions) % parts == 0:
            assert_equal_to_example_arrays(plan, positions, parts)


def test_a_step_spanning_many_epochs_and_epoch_zero() -> None:
    # A 3-record task crosses an epoch every few positions; a big one starts in epoch 0 and leaves it.
    plan = make_plan({"tiny": (3,), "big": (40, 0, 25)}, num_data_shards=8)
    for step in (0, 1, 2, 7, 10**6):
        assert_equal_to_example_arrays(plan, plan.positions(step), 8)
    assert_equal_to_example_arrays(plan, range(50, 98), 1)


def test_empty_groups_have_no_runs() -> None:
    plan = make_plan({"a": (5,), "b": (7,)}, rates={"a": 1, "b": 1000})
    bounds, *_ = task_runs(plan, plan.positions(3), 8)
    assert np.diff(bounds)[:8].tolist().count(0) >= 7  # task a has at most one example in the step
