"""The block epoch order: a bijection per epoch with an O(1) inverse, independent of hosts and of how far
the run goes, bounded reads per host and step, and a plan option that leaves plans without it unchanged."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.index import (
    FEISTEL,
    BatchSchedule,
    BlockOrder,
    PlanError,
    RunPlan,
    ShardLayout,
    Stage,
    TaskCache,
    assign,
    epoch_order,
    example_arrays,
    examples_at,
    global_batch,
    locate_example,
    occurrences,
    reads_bound,
    slice_positions,
)
from taskdata.index.chain import task_extents
from taskdata.index.orders.block import BlockPermutation, extents_per_block

# 1 record, primes, 2**k - 1 and 2**k + 1.
SIZES = (1, 2, 3, 97, 1009, 63, 65, 255, 257, 1023, 1025)
BLOCK = BlockOrder(16)


def plan_of(counts, *, order=BLOCK, seed=7, batch=32, shards=4, rates=None, tasks=None) -> RunPlan:
    tasks = tasks or ["t"]
    per_task = counts if len(tasks) > 1 else [counts]
    return RunPlan(
        name="r",
        mixture="m" if len(tasks) > 1 else tasks[0],
        caches={t: TaskCache(f"fp-{t}", tuple(c)) for t, c in zip(tasks, per_task, strict=True)},
        rates=rates,
        seed=seed,
        schedule=BatchSchedule.constant(batch),
        num_data_shards=shards,
        epoch_order=order,
    )


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("block_size", [1, 4, 16, 64, 5000])
def test_every_epoch_is_a_bijection_with_its_inverse(size, block_size):
    for epoch in (1, 2, 10**9):
        order = BlockOrder(block_size)
        perm = order.permutation(3, "task", epoch, size)
        values = [perm(i) for i in range(size)]
        assert sorted(values) == list(range(size)), (size, block_size, epoch)
        assert [perm.inverse(v) for v in values] == list(range(size))
        vector = order.permute_many([perm], np.zeros(size, np.int64), np.arange(size))
        assert vector.tolist() == values


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 3000),
    block_size=st.integers(1, 300),
    epoch=st.one_of(st.integers(1, 50), st.just(10**9)),
    seed=st.integers(0, 2**63 - 1),
)
def test_the_stream_of_positions_and_its_inverse_agree_in_any_epoch(size, block_size, epoch, seed):
    order = BlockOrder(block_size)
    start = epoch * size
    seen = set()
    for position in range(start, start + size):
        got_epoch, index = order.epoch_and_index(seed, "t", size, position)
        assert got_epoch == epoch and 0 <= index < size
        assert order.task_position(seed, "t", size, epoch, index) == position
        seen.add(index)
    assert len(seen) == size


@pytest.mark.parametrize("size", [1, 63, 257, 1009])
def test_blocks_are_contiguous_records_and_only_the_last_may_be_partial(size):
    block_size = 16
    perm = BlockOrder(block_size).permutation(11, "t", 4, size)
    values = np.array([perm(i) for i in range(size)])
    for start in range(0, size, block_size):
        block = values[start : start + block_size]
        # Consecutive records of the cache, wrapping from the last record to the first at most once.
        steps = np.diff(block) % size
        assert np.all(steps == 1), (start, block)


def test_epoch_zero_is_stored_order_and_each_later_epoch_its_own():
    order = BlockOrder(8)
    assert [order.epoch_and_index(1, "t", 100, p) for p in range(100)] == [(0, p) for p in range(100)]
    epochs = [tuple(order.epoch_and_index(1, "t", 100, e * 100 + p)[1] for p in range(100)) for e in (1, 2, 3)]
    assert len(set(epochs)) == 3


def test_negative_controls_another_seed_task_block_size_or_order_differ():
    def order_of(order=BLOCK, seed=7, task="t"):
        return [order.epoch_and_index(seed, task, 1025, 1025 + p)[1] for p in range(1025)]

    base = order_of()
    assert base == order_of()  # deterministic
    assert base != order_of(seed=8)
    assert base != order_of(task="u")
    assert base != order_of(order=BlockOrder(32))
    assert base != order_of(order=FEISTEL)


@pytest.mark.parametrize("counts", [(40, 0, 57, 31), (1,), (257,), (65, 63)])
@pytest.mark.parametrize("step", [0, 3, 4, 9, 40])
def test_the_global_batch_does_not_depend_on_the_number_of_hosts(counts, step):
    plan = plan_of(counts, batch=32, shards=1)
    whole = global_batch(plan, step)
    for hosts in (1, 2, 4, 8, 32):
        parts = [assign(plan, step, d, hosts).examples for d in range(hosts)]
        assert tuple(e for part in parts for e in part) == whole, hosts


def test_the_stream_is_prefix_stable_across_schedules_and_run_lengths():
    # Position -> record depends on nothing but the position: another batch size (or a ramp) cuts the same
    # stream into other steps, and a longer computation agrees with a shorter one on its prefix.
    small = plan_of((100, 23), batch=8, shards=1)
    large = RunPlan(**{**_fields(small), "schedule": BatchSchedule(start=8, end=64, ramp_steps=5, multiple_of=8)})
    stream = examples_at(small, range(0, 2000))
    assert examples_at(large, range(0, 700)) == stream[:700]
    assert sum((global_batch(small, s) for s in range(30)), ()) == stream[:240]
    assert example_arrays(small, range(0, 2000)).indices.tolist() == [e.index for e in stream]


def _fields(plan):
    return {f: getattr(plan, f) for f in plan.__dataclass_fields__}


def test_epoch_one_billion_is_exact_and_inverts_through_locate_example():
    plan = plan_of([(1021, 3), (257,)], tasks=["a", "b"], rates={"a": 3, "b": 1}, batch=32, shards=4)
    step = 10**9 * 1024 // 32 * 4  # well past epoch 10**9 of both tasks
    examples = global_batch(plan, step)
    assert examples and all(e.epoch >= 10**9 for e in examples)
    for e in examples:
        assert locate_example(plan, e.task, e.epoch, e.index) == (step, e.position)


@pytest.mark.parametrize(
    "counts, block_size, expected",
    [
        ((100,), 16, 2),  # one shard: only the wrap from the last record to the first breaks a block
        ((100,), 1, 1),
        ((5, 0, 5, 5), 16, 4),  # 16 records cyclically cross 3 boundaries (the empty shard is none)
        ((50, 50), 16, 2),
        ((3,), 16, 2),  # a block longer than the task wraps once
    ],
)
def test_extents_per_block_count_the_shard_boundaries_inside_a_block(counts, block_size, expected):
    assert extents_per_block(ShardLayout(counts), block_size) == expected


@settings(max_examples=25, deadline=None)
@given(
    counts=st.lists(st.integers(0, 90), min_size=1, max_size=5).filter(sum),
    other=st.lists(st.integers(0, 90), min_size=1, max_size=3).filter(sum),
    block_size=st.sampled_from([1, 4, 16, 64]),
    hosts=st.sampled_from([1, 2, 4, 8]),
    seed=st.integers(0, 1000),
)
def test_a_hosts_reads_per_step_never_exceed_the_stated_bound(counts, other, block_size, hosts, seed):
    plan = plan_of(
        [counts, other], tasks=["a", "b"], rates={"a": 3, "b": 1}, order=BlockOrder(block_size),
        seed=seed, batch=64, shards=hosts,
    )
    bound = reads_bound(plan, 64 // hosts)
    for step in [*range(40), 10**6, 10**6 + 1]:
        for d in range(hosts):
            bounds, *_ = task_extents(plan, slice_positions(plan, step, d), 1)
            assert int(bounds[-1]) <= bound, (step, d, bound)


def test_the_block_order_bounds_reads_where_the_per_record_order_does_not():
    counts = tuple([4096] * 16)
    block = plan_of(counts, order=BlockOrder(64), batch=2048, shards=8)
    feistel = plan_of(counts, order=FEISTEL, batch=2048, shards=8)
    step = 12_000  # epoch 375
    reads = [len(assign(p, step, 3).extents) for p in (block, feistel)]
    assert reads[0] <= reads_bound(block, 256) == 2 * (4 + 3) and reads[1] > 200
    assert reads_bound(feistel, 256) == 256


def test_a_plan_without_the_option_keeps_its_json_and_fingerprint():
    feistel = plan_of((100, 23), order=FEISTEL)
    assert "epoch_order" not in feistel.to_dict()
    assert RunPlan.from_dict(feistel.to_dict()) == feistel
    block = plan_of((100, 23))
    data = block.to_dict()
    assert data["epoch_order"] == {"kind": "block", "block_size": 16}
    assert RunPlan.from_dict(data) == block
    assert block.fingerprint() != feistel.fingerprint()
    assert plan_of((100, 23), order=BlockOrder(32)).fingerprint() != block.fingerprint()


def test_bad_epoch_orders_are_named():
    with pytest.raises(PlanError, match=r"The block epoch order takes the options \['block_size'\] but got none"):
        epoch_order("block")
    with pytest.raises(PlanError, match="needs a block size .* got 0"):
        BlockOrder(0)
    with pytest.raises(PlanError, match=r"The feistel epoch order takes no options but got \['block_size'\]"):
        epoch_order("feistel", block_size=8)
    with pytest.raises(PlanError, match=r"must be one of \['block', 'feistel', 'windowed'\] but got 'era'"):
        epoch_order("era")
    with pytest.raises(PlanError, match="must be an EpochOrder"):
        plan_of((10,), order="block")  # type: ignore[arg-type]  # as above
    data = plan_of((10,)).to_dict()
    with pytest.raises(PlanError, match="epoch_order must be an object"):
        RunPlan.from_dict({**data, "epoch_order": "block"})
    with pytest.raises(PlanError, match=r"takes the options \['block_size'\] but got \['size'\]"):
        RunPlan.from_dict({**data, "epoch_order": {"kind": "block", "size": 16}})
    # The form a feistel order's dict once had (its block size null) still reads.
    assert RunPlan.from_dict({**data, "epoch_order": {"kind": "feistel", "block_size": None}}).epoch_order == FEISTEL
    with pytest.raises(PlanError, match="unknown \\['era'\\]"):
        RunPlan.from_dict({**data, "era": 1})
    with pytest.raises(PlanError, match="Index must be an integer in \\[0, 10\\)"):
        BlockPermutation(10, 4, 1)(10)


@settings(max_examples=20, deadline=None)
@given(
    counts=st.lists(st.integers(1, 90), min_size=1, max_size=4),
    other=st.lists(st.integers(1, 90), min_size=1, max_size=3),
    block_size=st.sampled_from([1, 4, 16]),
    hosts=st.sampled_from([1, 2, 4]),
    stage_steps=st.lists(st.integers(1, 60), min_size=1, max_size=3, unique=True),
    seed=st.integers(0, 1000),
)
def test_with_stages_the_reads_stay_within_the_bound_and_each_record_read_is_found_again(
    counts, other, block_size, hosts, stage_steps, seed
):
    """Stages change the rates (one leaves task b out) and the batch size; the bound covers every stage, and
    the inverse the ledger uses (occurrences) finds each read of a record at the step that read it."""
    base = plan_of(
        [counts, other], tasks=["a", "b"], rates={"a": 3, "b": 1}, order=BlockOrder(block_size),
        seed=seed, batch=32, shards=hosts,
    )
    stages = tuple(
        Stage(step, {"a": 1 + k % 2, "b": k % 3} if k % 2 == 0 else None,
              BatchSchedule.constant(64) if k % 2 else None)
        for k, step in enumerate(sorted(stage_steps))
    )
    plan = dataclasses.replace(base, stages=stages)
    bound = reads_bound(plan, 64 // hosts)
    for step in [*range(0, 70, 3), 10**6]:
        for d in range(hosts):
            bounds, *_ = task_extents(plan, slice_positions(plan, step, d), 1)
            assert int(bounds[-1]) <= bound, (step, d, bound)
    for step in (5, 61, 10**6):
        batch = [e for d in range(hosts) for e in assign(plan, step, d, hosts).examples]
        for ref in batch[:4]:  # a task smaller than the batch is read several times in one step
            found = occurrences(plan, ref.task, ref.index, from_step=step, until_step=step + 1, limit=10**6)
            expected = sorted(e.position for e in batch if (e.task, e.index) == (ref.task, ref.index))
            assert sorted(o.position for o in found) == expected, (step, ref)
