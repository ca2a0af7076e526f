"""Host slices and read instructions: disjoint slices, host-count independence, skips, golden values."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.index import (
    BatchSchedule,
    PlanError,
    RunPlan,
    SkipRange,
    TaskCache,
    assign,
    examples_at,
    extents,
    global_batch,
    locate_example,
    slice_positions,
)


def golden_plan(**overrides: Any) -> RunPlan:
    fields: dict[str, Any] = {
        "name": "golden",
        "mixture": "mix",
        "caches": {"a": TaskCache("fp_a", (4, 3, 5)), "b": TaskCache("fp_b", (2, 1))},
        "rates": {"a": 2, "b": 1},
        "seed": 42,
        "schedule": BatchSchedule.constant(4),
        "num_data_shards": 2,
    }
    fields.update(overrides)
    return RunPlan(**fields)


def as_tuples(plan: RunPlan, step: int) -> list[tuple[str, int, int, int, int]]:
    return [(e.task, e.epoch, e.index, e.shard, e.record) for e in global_batch(plan, step)]


def test_golden_first_steps_of_a_two_task_mixture() -> None:
    # Recipe: tasks a (shards of 4, 3, 5 records) and b (2, 1) at rates 2:1, seed 42, batch 4.
    # Tuples are (task, epoch, index, shard, record); b runs out after 3 records and starts epoch 1.
    plan = golden_plan()
    assert [as_tuples(plan, s) for s in range(5)] == [
        [("a", 0, 0, 0, 0), ("b", 0, 0, 0, 0), ("a", 0, 1, 0, 1), ("a", 0, 2, 0, 2)],
        [("b", 0, 1, 0, 1), ("a", 0, 3, 0, 3), ("a", 0, 4, 1, 0), ("b", 0, 2, 1, 0)],
        [("a", 0, 5, 1, 1), ("a", 0, 6, 1, 2), ("b", 1, 1, 0, 1), ("a", 0, 7, 2, 0)],
        [("a", 0, 8, 2, 1), ("b", 1, 2, 1, 0), ("a", 0, 9, 2, 2), ("a", 0, 10, 2, 3)],
        [("b", 1, 0, 0, 0), ("a", 0, 11, 2, 4), ("a", 1, 7, 2, 0), ("b", 2, 2, 1, 0)],
    ]
    # Negative control: another seed reorders epoch 1 of b (epoch 0 is the cache's own order).
    other = golden_plan(seed=43)
    assert [as_tuples(other, s) for s in range(2)] == [as_tuples(plan, s) for s in range(2)]
    assert [as_tuples(other, s) for s in range(2, 5)] != [as_tuples(plan, s) for s in range(2, 5)]


def test_golden_extents() -> None:
    assignment = assign(golden_plan(), 0, 1)
    assert assignment.positions == range(2, 4)
    assert [(r.task, r.shard, r.first_record, r.count) for r in assignment.extents] == [("a", 0, 1, 2)]


def mixed_plan(**overrides: Any) -> RunPlan:
    fields: dict[str, Any] = {
        "name": "mixed",
        "mixture": "mix",
        "caches": {
            "big": TaskCache("fp_big", (50, 49, 51, 50)),
            "mid": TaskCache("fp_mid", (7, 0, 8)),
            "tiny": TaskCache("fp_tiny", (3,)),
        },
        "rates": {"big": 0.6, "mid": 0.3, "tiny": 0.1},
        "seed": 7,
        "schedule": BatchSchedule.ramp(8, 64, 20, multiple_of=8),
        "num_data_shards": 8,
    }
    fields.update(overrides)
    return RunPlan(**fields)


@pytest.mark.parametrize("step", [0, 1, 7, 19, 20, 33])
def test_slices_are_disjoint_and_make_up_the_global_batch_for_any_host_count(step: int) -> None:
    plan = mixed_plan()
    batch = global_batch(plan, step)
    assert len(batch) == plan.schedule.batch_size(step)
    assert len({(e.task, e.epoch, e.index) for e in batch}) == len(batch)  # nothing read twice in a step
    for hosts in (1, 2, 4, 8):
        slices = [assign(plan, step, h, hosts).examples for h in range(hosts)]
        assert all(len(s) == len(batch) // hosts for s in slices)
        assert sum(slices, ()) == batch


def test_slice_positions_tile_the_step() -> None:
    plan = mixed_plan()
    for step in (0, 5, 25):
        ranges = [slice_positions(plan, step, h) for h in range(8)]
        assert ranges[0].start == plan.schedule.first_position(step)
        assert all(a.stop == b.start for a, b in itertools.pairwise(ranges))
        assert ranges[-1].stop == plan.schedule.first_position(step + 1)


def test_a_host_count_that_does_not_divide_the_batch_is_an_error() -> None:
    with pytest.raises(PlanError) as raised:
        assign(mixed_plan(), 3, 0, 3)
    assert str(raised.value) == (
        "Step 3 has a global batch of 16 examples, which 3 data shards cannot split evenly. "
        "Use a number of data shards that divides every batch size (here 16)."
    )
    with pytest.raises(PlanError, match=r"Data shard must be an integer in \[0, 8\) but got 8"):
        assign(mixed_plan(), 3, 8)


def test_skipped_steps_deliver_nothing_and_shift_nothing() -> None:
    plain = mixed_plan()
    skipping = mixed_plan(skip=(SkipRange(3, 5),))
    for step in range(8):
        for host in range(8):
            got = assign(skipping, step, host)
            assert got.skipped == (step in (3, 4))
            assert got.positions == slice_positions(plain, step, host)
            if got.skipped:
                assert got.examples == () and got.extents == ()
            else:
                assert got.examples == assign(plain, step, host).examples
    assert global_batch(skipping, 3) == ()
    # The step after a skip gets the data that follows the skipped batches.
    assert global_batch(skipping, 5)[0].position == plain.schedule.first_position(5)


@given(step=st.integers(0, 10**9), seed=st.integers(0, 2**63 - 1))
@settings(max_examples=40, deadline=None)
def test_locate_example_finds_the_step_that_read_it(step: int, seed: int) -> None:
    plan = mixed_plan(seed=seed)
    for example in assign(plan, step, 5).examples:
        assert locate_example(plan, example.task, example.epoch, example.index) == (step, example.position)


def test_every_record_is_read_once_per_epoch() -> None:
    plan = mixed_plan(rates=None, mixture="mid", caches={"mid": TaskCache("fp_mid", (7, 0, 8))})
    examples = examples_at(plan, range(15 * 4))
    for epoch in range(4):
        records = sorted((e.shard, e.record) for e in examples if e.epoch == epoch)
        assert records == [(0, r) for r in range(7)] + [(2, r) for r in range(8)]
    assert [e.index for e in examples[:15]] == list(range(15))  # epoch 0 is stored order
    assert [e.index for e in examples[15:30]] != list(range(15))


def test_extents_expand_back_to_the_examples() -> None:
    plan = mixed_plan()
    for step in (0, 30, 10**6):
        examples = global_batch(plan, step)
        found = extents(examples)
        expanded = [(r.task, r.shard, r.first_record + i) for r in found for i in range(r.count)]
        assert expanded == [(e.task, e.shard, e.record) for e in examples]
        # Maximal: two neighbouring extents could not have been one.
        for left, right in itertools.pairwise(found):
            assert (left.task, left.shard, left.first_record + left.count) != (
                right.task,
                right.shard,
                right.first_record,
            )


def test_epoch_zero_of_a_single_task_reads_long_extents() -> None:
    plan = RunPlan(
        name="single",
        mixture="c4",
        caches={"c4": TaskCache("fp", (1000,) * 4)},
        rates=None,
        seed=0,
        schedule=BatchSchedule.constant(512),
        num_data_shards=4,
    )
    assert [(r.shard, r.first_record, r.count) for r in assign(plan, 1, 3).extents] == [
        (0, 896, 104),
        (1, 0, 24),
    ]
    later = assign(plan, 9, 0).extents  # epoch 1: a permutation, so mostly extents of one record
    assert sum(r.count for r in later) == 128 and len(later) > 100
