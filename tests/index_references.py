"""The index math's references and drawn plans, shared by the index tests (not a test module).

``reference_examples`` and ``reference_assign`` compose the links of the chain one position at a time, the
way the code ran before it was vectorised: a property that compares them with the array code compares two
implementations. Also a cache's shard table held in memory (``MemoryTable``) and helpers that read a step's
reads back as examples.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
from hypothesis import strategies as st

from taskdata.index import (
    BatchSchedule,
    BlockOrder,
    ExampleRef,
    Extent,
    HostAssignment,
    RunPlan,
    SkipRange,
    StepReads,
    TaskCache,
    example_arrays,
    slice_positions,
)
from taskdata.index.chain import task_extents

__all__ = [
    "MemoryTable",
    "assert_task_extents_equal_example_arrays",
    "make_plan",
    "plans",
    "range_task_positions",
    "rate",
    "reference_assign",
    "reference_examples",
    "reference_extents",
    "shard_size",
    "step_examples",
    "steps",
]


class MemoryTable:
    """A ``ShardTable`` in memory: record ``r`` of shard ``s`` takes 16 + (7s + 3r) % 41 bytes."""

    def __init__(self, task: str, counts: tuple[int, ...], version: str = "v1"):
        self.task, self.version = task, version
        self.shard_uris = tuple(
            f"mem://{task}/{version}/train-{s:05d}-of-{len(counts):05d}" for s in range(len(counts))
        )
        self.offsets = [
            np.concatenate(([0], np.cumsum([16 + (7 * s + 3 * r) % 41 for r in range(n)]))).astype(np.int64)
            for s, n in enumerate(counts)
        ]

    def byte_range(self, shard: int, first: int, count: int) -> tuple[int, int]:
        table = self.offsets[shard]
        return int(table[first]), int(table[first + count] - table[first])

    def byte_ranges(self, shards, firsts, counts):
        pairs = [
            self.byte_range(s, f, c)
            for s, f, c in zip(shards.tolist(), firsts.tolist(), counts.tolist(), strict=True)
        ]
        return np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64)


def reference_examples(plan: RunPlan, positions: range) -> tuple[ExampleRef, ...]:
    out = []
    for position in positions:
        task, task_position = plan.mixing.locate(position)
        layout, name = plan.layouts[task], plan.task_names[task]
        epoch, index = plan.epoch_order.epoch_and_index(plan.seed, name, layout.num_records, task_position)
        shard, record = layout.locate(index)
        out.append(ExampleRef(position, name, epoch, index, shard, record))
    return tuple(out)


def reference_extents(examples: tuple[ExampleRef, ...]) -> tuple[Extent, ...]:
    out: list[Extent] = []
    for e in examples:
        last = out[-1] if out else None
        if last and (last.task, last.shard, last.first_record + last.count) == (e.task, e.shard, e.record):
            out[-1] = Extent(last.task, last.shard, last.first_record, last.count + 1)
        else:
            out.append(Extent(e.task, e.shard, e.record, 1))
    return tuple(out)


def reference_assign(plan: RunPlan, step: int, data_shard: int, num_data_shards: int) -> HostAssignment:
    positions = slice_positions(plan, step, data_shard, num_data_shards)
    skipped = plan.is_skipped(step)
    examples = () if skipped else reference_examples(plan, positions)
    return HostAssignment(step, data_shard, num_data_shards, positions, skipped, examples, reference_extents(examples))


def assert_task_extents_equal_example_arrays(plan: RunPlan, positions: range, parts: int) -> None:
    """The extents of every (task, slice) are ``cut(slice).extents(task)`` of ``example_arrays``."""
    arrays = example_arrays(plan, positions)
    bounds, shards, firsts, counts, tasks = task_extents(plan, positions, parts)
    assert tasks.tolist() == arrays.tasks.tolist()
    size = len(positions) // parts
    num_tasks = len(plan.task_names)
    assert len(bounds) == num_tasks * parts + 1 and bounds[-1] == len(shards)
    for task in range(num_tasks):
        for p in range(parts):
            a, b = bounds[task * parts + p], bounds[task * parts + p + 1]
            alone = arrays.cut(p * size, (p + 1) * size).extents(task)[1:]
            got = (shards[a:b], firsts[a:b], counts[a:b])
            assert [x.tolist() for x in got] == [x.tolist() for x in alone], (parts, p, task)


def step_examples(reads: StepReads) -> list[tuple[str, int, int]]:
    """(task, shard, record) of every example of a slice, in order."""
    queues = [iter(zip(*task.records(), strict=True)) for task in reads.tasks]
    return [(reads.tasks[t].task, *map(int, next(queues[t]))) for t in reads.order.tolist()]


def range_task_positions(mixing, start: int, tasks) -> list[int]:
    """The task position of each position from ``start`` on whose tasks are ``tasks``: within a range each
    task's positions are consecutive in its own stream from ``counts(start)`` on, as the chain takes them."""
    taken = list(mixing.counts(start))
    out = []
    for t in tasks.tolist():
        out.append(taken[t])
        taken[t] += 1
    return out


def make_plan(caches: dict[str, tuple[int, ...]], **overrides: Any) -> RunPlan:
    fields: dict[str, Any] = {
        "name": "arrays",
        "mixture": "mix",
        "caches": {name: TaskCache(f"fp_{name}", counts) for name, counts in caches.items()},
        "rates": None if len(caches) == 1 else {name: i + 1 for i, name in enumerate(caches)},
        "seed": 5,
        "schedule": BatchSchedule.constant(64),
        "num_data_shards": 8,
    }
    fields.update(overrides)
    return RunPlan(**fields)


# Shard sizes from empty to huge: tiny tasks run through many epochs per step, huge ones never leave epoch 0
# (at 10**12 records per shard), and 2**40 gives permutations of 41-bit sizes when it is reached.
shard_size = st.one_of(
    st.integers(0, 6), st.integers(0, 3000), st.sampled_from([10**5 + 3, 2**20, 2**40, 10**12])
)
rate = st.one_of(st.integers(1, 12), st.sampled_from([Fraction(1, 1000), 999, Fraction(7, 3), 10**9]))


@st.composite
def plans(draw: st.DrawFn) -> RunPlan:
    num_tasks = draw(st.integers(1, 6))
    caches = {}
    for i in range(num_tasks):
        counts = draw(st.lists(shard_size, min_size=1, max_size=6).filter(lambda c: sum(c) > 0))
        caches[f"task_{i}"] = TaskCache(f"fp_{i}", tuple(counts))
    rates = {name: draw(rate) for name in caches} if num_tasks > 1 or draw(st.booleans()) else None
    unit = draw(st.sampled_from([8, 16, 24]))
    if draw(st.booleans()):
        schedule = BatchSchedule.constant(unit * draw(st.integers(1, 8)))
    else:
        low, high = sorted(draw(st.lists(st.integers(1, 12), min_size=2, max_size=2)))
        schedule = BatchSchedule.ramp(unit * low, unit * high, draw(st.integers(1, 10**6)), multiple_of=unit)
    skips = draw(st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 10**6)), max_size=3))
    order = draw(st.sampled_from([None, 1, 3, 64]))
    return RunPlan(
        name="drawn",
        mixture="drawn_mix",
        caches=caches,
        rates=rates,
        seed=draw(st.integers(0, 2**63 - 1)),
        schedule=schedule,
        num_data_shards=8,
        skip=tuple(SkipRange(start, start + length) for start, length in skips),
        **({} if order is None else {"epoch_order": BlockOrder(order)}),
    )


steps = st.one_of(st.integers(0, 60), st.integers(0, 10**9))
