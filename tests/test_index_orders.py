"""Epoch orders behind one interface: the registry builds each by kind, and a new order is one class and
one registry entry, which the chain (scalar and arrays), the plan's JSON, the inverse and the reads bound
then take without another change."""

from __future__ import annotations

import dataclasses
import types
from typing import ClassVar

import numpy as np
import pytest

from taskdata.index import (
    FEISTEL,
    BatchSchedule,
    BlockOrder,
    EpochOrder,
    PlanError,
    RunPlan,
    ShardLayout,
    TaskCache,
    assign,
    epoch_order,
    global_batch,
    locate_example,
    orders,
    reads_bound,
)
from tests.index_references import assert_task_extents_equal_example_arrays, reference_assign


@dataclasses.dataclass(frozen=True)
class Reversed:
    """Epoch ``e`` reads the cache's order backwards, rotated by ``e``: a bijection anyone can check."""

    size: int
    epoch: int

    def __call__(self, index: int) -> int:
        return (self.size - 1 - index + self.epoch) % self.size

    def inverse(self, value: int) -> int:
        return (self.size - 1 - value + self.epoch) % self.size


@dataclasses.dataclass(frozen=True)
class ReversedOrder(EpochOrder):
    kind: ClassVar[str] = "reversed"
    stride: int = 1  # an option, to show that options travel through the plan's JSON

    def make_permutation(self, seed: int, task: str, epoch: int, size: int) -> Reversed:
        return Reversed(size, epoch * self.stride)

    def apply_vectorised(self, permutations, which, indices):
        sizes = np.array([p.size for p in permutations], np.int64)[which]
        epochs = np.array([p.epoch for p in permutations], np.int64)[which]
        return (sizes - 1 - indices + epochs) % sizes

    def reads_bound(self, layout: ShardLayout, positions: int) -> int:
        return positions

    def describe(self) -> str:
        return f"reversed (stride {self.stride})"


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(orders, "ORDERS", types.MappingProxyType({**orders.ORDERS, "reversed": ReversedOrder}))


def plan_with(order: EpochOrder) -> RunPlan:
    return RunPlan(
        name="orders",
        mixture="mix",
        caches={"a": TaskCache("fp_a", (7, 0, 9, 5)), "b": TaskCache("fp_b", (4, 6))},
        rates={"a": 3, "b": 1},
        seed=11,
        schedule=BatchSchedule.constant(32),
        num_data_shards=4,
        epoch_order=order,
    )


def test_the_registry_builds_each_order_by_kind():
    assert sorted(orders.ORDERS) == ["block", "feistel", "windowed"]
    assert epoch_order("feistel") == FEISTEL
    assert epoch_order("block", block_size=64) == BlockOrder(64)
    assert [orders.epoch_order_from_dict(o.to_dict()) for o in (FEISTEL, BlockOrder(8))] == [FEISTEL, BlockOrder(8)]
    assert BlockOrder(8).to_dict() == {"kind": "block", "block_size": 8}
    with pytest.raises(PlanError, match=r"Epoch order must be one of \['block', 'feistel', 'windowed'\] but got 'reversed'"):
        epoch_order("reversed")


def test_a_new_order_is_one_class_and_one_registry_entry(registered):
    order = epoch_order("reversed", stride=3)
    plan = plan_with(order)
    # The plan's JSON names it and reads it back; its fingerprint is not the default order's.
    assert plan.to_dict()["epoch_order"] == {"kind": "reversed", "stride": 3}
    assert RunPlan.from_dict(plan.to_dict()) == plan
    assert plan.fingerprint() != plan_with(FEISTEL).fingerprint()
    # The chain takes it: position by position, as arrays, and as extents, all equal.
    for step in (0, 3, 10**6):
        for host in range(4):
            assert assign(plan, step, host) == reference_assign(plan, step, host, 4)
        assert_task_extents_equal_example_arrays(plan, plan.positions(step), 4)
    # What it reads past epoch 0 is its own permutation of the epoch, and the inverse finds each read again.
    later = global_batch(plan, 10**6)
    assert all(e.epoch >= 1 for e in later)
    assert [e.index for e in later] != [e.index for e in global_batch(plan_with(FEISTEL), 10**6)]
    assert [e.index for e in later] != [e.index for e in global_batch(plan_with(epoch_order("reversed", stride=1)), 10**6)]
    for e in later:
        n = plan.layouts[plan.task_index(e.task)].num_records
        offset = plan.mixing.locate(e.position)[1] - e.epoch * n
        assert e.index == (n - 1 - offset + 3 * e.epoch) % n
        assert locate_example(plan, e.task, e.epoch, e.index) == (10**6, e.position)
    assert reads_bound(plan, 8) == 8  # its own bound: every example may be its own read
