"""The windowed block order: a bijection per epoch with an O(1) inverse, independent of hosts; each block's
records dealt out over block_size steps at one place of the batch (records read together never share a
batch); the bounds `taskdata plan` states; a plan option that leaves the other orders' plans unchanged."""

from __future__ import annotations

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
    TaskCache,
    WindowedOrder,
    assign,
    epoch_order,
    example_arrays,
    global_batch,
    locate_example,
    reads_bound,
    requests_bound,
    slice_positions,
)
from taskdata.index.orders.windowed import WindowedPermutation

SIZES = (1, 2, 3, 97, 1009, 63, 65, 255, 257, 1023, 1025)
WINDOWED = WindowedOrder(16, 32)


def plan_of(counts, *, order, seed=7, batch=32, shards=4) -> RunPlan:
    return RunPlan(name="r", mixture="t", caches={"t": TaskCache("fp", tuple(counts))}, rates=None, seed=seed,
                   schedule=BatchSchedule.constant(batch), num_data_shards=shards, epoch_order=order)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("block_size, width", [(1, 1), (4, 8), (16, 32), (16, 7), (64, 5000), (5000, 16)])
def test_every_epoch_is_a_bijection_with_its_inverse(size, block_size, width):
    for epoch in (1, 2, 10**9):
        order = WindowedOrder(block_size, width)
        perm = order.permutation(3, "task", epoch, size)
        values = [perm(i) for i in range(size)]
        assert sorted(values) == list(range(size)), (size, block_size, width, epoch)
        assert [perm.inverse(v) for v in values] == list(range(size))
        vector = order.permute_many([perm], np.zeros(size, np.int64), np.arange(size))
        assert vector.tolist() == values


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 3000),
    block_size=st.integers(1, 300),
    width=st.integers(1, 600),
    epoch=st.one_of(st.integers(1, 50), st.just(10**9)),
    seed=st.integers(0, 2**63 - 1),
)
def test_the_stream_of_positions_and_its_inverse_agree_in_any_epoch(size, block_size, width, epoch, seed):
    order = WindowedOrder(block_size, width)
    start = epoch * size
    seen = set()
    for position in range(start, start + size):
        got_epoch, index = order.epoch_and_index(seed, "t", size, position)
        assert got_epoch == epoch and 0 <= index < size
        assert order.task_position(seed, "t", size, epoch, index) == position
        seen.add(index)
    assert len(seen) == size


def test_a_block_is_dealt_out_over_block_size_rows_of_one_column():
    # 64 records per row (width), blocks of 16: column c reads consecutive records of one block at consecutive
    # rows, and a new block starts at the rows where row + column is a multiple of 16 (one column in 16).
    size, block_size, width = 64 * 80, 16, 64
    perm = WindowedOrder(block_size, width).permutation(5, "t", 1, size)
    table = np.array([perm(i) for i in range(size)]).reshape(-1, width)
    steps = (np.diff(table, axis=0) % size) != 1  # True where a column's next record is not the next one
    for row in range(steps.shape[0]):
        starting = np.flatnonzero(steps[row])  # columns that start a block (or wrap) at row + 1
        assert all((row + 1 + c) % block_size == 0 for c in starting), (row, starting)
        assert len(starting) <= width // block_size + 1
    # A row's records come from as many blocks as it has columns: no two in one block of the epoch.
    blocks = {tuple(sorted(perm.blocks.inverse(int(v)) // block_size for v in row)) for row in table[:5]}
    assert all(len(set(b)) == width for b in blocks)


def test_records_read_together_never_share_a_batch_but_under_the_block_order_they_do():
    n, batch = 4096, 64
    shares = {}
    for name, order in (("windowed", WindowedOrder(16, batch)), ("block", BlockOrder(16))):
        plan = plan_of((n,), order=order, batch=batch, shards=1)
        indices = example_arrays(plan, range(n, 2 * n)).indices  # epoch 1
        batch_of = np.empty(n, np.int64)
        batch_of[indices] = np.arange(n) // batch
        shares[name] = float(np.mean(batch_of[:-1] == batch_of[1:]))  # neighbours in the cache, one batch
    assert shares["windowed"] < 0.01 and shares["block"] > 0.9, shares


def test_negative_controls_another_seed_task_width_block_size_or_order_differ():
    def order_of(order=WINDOWED, seed=7, task="t"):
        return [order.epoch_and_index(seed, task, 1025, 1025 + p)[1] for p in range(1025)]

    base = order_of()
    assert base == order_of()  # deterministic
    for other in (order_of(seed=8), order_of(task="u"), order_of(order=WindowedOrder(16, 33)),
                  order_of(order=WindowedOrder(32, 32)), order_of(order=BlockOrder(16)),
                  order_of(order=FEISTEL)):
        assert other != base


@pytest.mark.parametrize("counts", [(40, 0, 57, 31), (1,), (257,), (65, 63)])
@pytest.mark.parametrize("step", [0, 3, 4, 9, 40])
def test_the_global_batch_does_not_depend_on_the_number_of_hosts(counts, step):
    plan = plan_of(counts, order=WindowedOrder(4, 32), batch=32, shards=1)
    whole = global_batch(plan, step)
    for hosts in (1, 2, 4, 8, 32):
        parts = [assign(plan, step, d, hosts).examples for d in range(hosts)]
        assert tuple(e for part in parts for e in part) == whole, hosts
    for e in whole:
        assert locate_example(plan, e.task, e.epoch, e.index)[1] == e.position


def test_each_host_keeps_its_columns_so_it_reads_each_block_of_a_column_once():
    # Width = the global batch: a host's slice is the same columns at every step, so over block_size steps the
    # records of its slice are whole blocks, each met in block_size consecutive steps.
    n, block_size, batch, hosts = 8192, 16, 64, 4
    plan = plan_of((n,), order=WindowedOrder(block_size, batch), batch=batch, shards=hosts)
    first = n // batch  # epoch 1
    for host in range(hosts):
        per_column: dict[int, list[int]] = {}
        for step in range(first, first + 4 * block_size):
            arrays = example_arrays(plan, slice_positions(plan, step, host))
            for column, record in enumerate(arrays.indices.tolist()):
                per_column.setdefault(column, []).append(record)
        for records in per_column.values():
            runs = 1 + int(np.count_nonzero(np.diff(records) % n != 1))
            assert runs <= 4 + 1, runs  # 4 blocks of 16 rows, and one more where the column's turn cuts one


def test_the_plan_states_its_bounds():
    counts = (4096,)
    plan = plan_of(counts, order=WindowedOrder(64, 2048), batch=2048, shards=8)
    assert reads_bound(plan, 256) == 256  # the instructions may name a read per example
    assert requests_bound(plan, 256) == 2 * (4 + 1) * 2  # blocks of 64 may wrap the single shard once
    assert plan.epoch_order.read_horizon == 64 and plan.epoch_order.records_held(256) == 256 * 64
    block = plan_of(counts, order=BlockOrder(64), batch=2048, shards=8)
    assert requests_bound(block, 256) == reads_bound(block, 256) and block.epoch_order.read_horizon == 0
    assert block.epoch_order.records_held(256) == 256


def test_the_options_json_and_fingerprint():
    plan = plan_of((100,), order=WindowedOrder(16, 32))
    data = plan.to_dict()
    assert data["epoch_order"] == {"kind": "windowed", "block_size": 16, "width": 32}
    assert RunPlan.from_dict(data) == plan
    # The block order's JSON (and so its plans' fingerprints) has no width.
    assert plan_of((100,), order=BlockOrder(16)).to_dict()["epoch_order"] == {"kind": "block", "block_size": 16}
    assert plan.fingerprint() != plan_of((100,), order=WindowedOrder(16, 64)).fingerprint()
    with pytest.raises(PlanError, match="needs a width .* got None"):
        WindowedOrder(16, None)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"The block epoch order takes the options \['block_size'\] but got"):
        epoch_order("block", block_size=16, width=32)
    with pytest.raises(PlanError, match="windowed epoch order needs a block size"):
        WindowedOrder(0, 32)
    with pytest.raises(PlanError, match=r"The windowed epoch order takes the options \['block_size', 'width'\]"):
        RunPlan.from_dict({**data, "epoch_order": {"kind": "windowed", "width": 3}})
    with pytest.raises(PlanError, match="Index must be an integer in \\[0, 10\\)"):
        WindowedPermutation(10, 4, 3, 1)(10)
