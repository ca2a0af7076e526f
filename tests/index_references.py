"""The index math's scalar reference chain and drawn plans, shared by the index tests (not a test module).

``reference_examples`` and ``reference_assign`` compose the scalar functions one position at a time, the
way the code ran before it was vectorised: a property that compares them with the array code compares two
implementations.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from hypothesis import strategies as st

from taskdata.index import (
    BatchSchedule,
    ExampleRef,
    HostAssignment,
    ReadRun,
    RunPlan,
    SkipRange,
    StepReads,
    TaskCache,
    epoch_and_index,
    slice_positions,
)

__all__ = [
    "make_plan",
    "plans",
    "rate",
    "reference_assign",
    "reference_examples",
    "reference_runs",
    "shard_size",
    "step_examples",
    "steps",
]


def reference_examples(plan: RunPlan, positions: range) -> tuple[ExampleRef, ...]:
    out = []
    for position in positions:
        task, task_position = plan.mixing.locate(position)
        layout, name = plan.layouts[task], plan.task_names[task]
        epoch, index = epoch_and_index(plan.seed, name, layout.num_records, task_position)
        shard, record = layout.locate(index)
        out.append(ExampleRef(position, name, epoch, index, shard, record))
    return tuple(out)


def reference_runs(examples: tuple[ExampleRef, ...]) -> tuple[ReadRun, ...]:
    runs: list[ReadRun] = []
    for e in examples:
        last = runs[-1] if runs else None
        if last and (last.task, last.shard, last.first_record + last.count) == (e.task, e.shard, e.record):
            runs[-1] = ReadRun(last.task, last.shard, last.first_record, last.count + 1)
        else:
            runs.append(ReadRun(e.task, e.shard, e.record, 1))
    return tuple(runs)


def reference_assign(plan: RunPlan, step: int, data_shard: int, num_data_shards: int) -> HostAssignment:
    positions = slice_positions(plan, step, data_shard, num_data_shards)
    skipped = plan.is_skipped(step)
    examples = () if skipped else reference_examples(plan, positions)
    runs = reference_runs(examples)
    return HostAssignment(step, data_shard, num_data_shards, positions, skipped, examples, runs)


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
    return RunPlan(
        name="drawn",
        mixture="drawn_mix",
        caches=caches,
        rates=rates,
        seed=draw(st.integers(0, 2**63 - 1)),
        schedule=schedule,
        num_data_shards=8,
        skip=tuple(SkipRange(start, start + length) for start, length in skips),
    )


steps = st.one_of(st.integers(0, 60), st.integers(0, 10**9))


def step_examples(reads: StepReads) -> list[tuple[str, int, int]]:
    """(task, shard, record) of every example of a slice, in order."""
    queues = [iter(zip(*task.records(), strict=True)) for task in reads.tasks]
    return [(reads.tasks[t].task, *map(int, next(queues[t]))) for t in reads.order.tolist()]
