"""What each data shard reads at a step: its examples in order, and the extents they make.

Step ``s`` covers stream positions ``[P(s), P(s) + B(s))``; data shard ``d`` of ``D`` reads the
contiguous slice ``d`` of it (``B(s) / D`` positions). Every position goes through the same chain
(``taskdata.index.chain``), so the global batch is the same whatever ``D`` is, and the slices of a step
are disjoint and make up the global batch. ``extents`` compresses a slice's examples into extents:
consecutive records of one shard, each one ranged read.

These are Python objects, one per example, for people and tools (the ledger, the summary, tests); the
server and the trainer client read a step as ``StepReads`` (``taskdata.index.step_slices``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from taskdata.index.chain import ExampleArrays, ExampleRef, examples_and_arrays, examples_at, extent_starts
from taskdata.index.errors import PlanError
from taskdata.index.plan import RunPlan

__all__ = [
    "Extent",
    "HostAssignment",
    "assign",
    "extents",
    "global_batch",
    "locate_example",
    "slice_positions",
]


# Extent writes its fields straight into the instance dict, as ExampleRef does (see there).
@dataclasses.dataclass(frozen=True, init=False)
class Extent:
    """Read ``count`` consecutive records of ``task``'s cache shard ``shard`` from ``first_record`` on."""

    task: str
    shard: int
    first_record: int
    count: int

    def __init__(self, task: str, shard: int, first_record: int, count: int) -> None:
        self.__dict__.update(task=task, shard=shard, first_record=first_record, count=count)


@dataclasses.dataclass(frozen=True)
class HostAssignment:
    """What data shard ``data_shard`` of ``num_data_shards`` reads at ``step`` (nothing if skipped)."""

    step: int
    data_shard: int
    num_data_shards: int
    positions: range
    skipped: bool
    examples: tuple[ExampleRef, ...]
    extents: tuple[Extent, ...]


def slice_positions(plan: RunPlan, step: int, data_shard: int, num_data_shards: int | None = None) -> range:
    """The stream positions data shard ``data_shard`` of ``num_data_shards`` (default: the plan's) reads."""
    shards = plan.num_data_shards if num_data_shards is None else num_data_shards
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise PlanError(f"Number of data shards must be a positive integer but got {shards!r}.")
    if isinstance(data_shard, bool) or not isinstance(data_shard, int) or not 0 <= data_shard < shards:
        raise PlanError(f"Data shard must be an integer in [0, {shards}) but got {data_shard!r}.")
    positions = plan.positions(step)
    size = len(positions)
    if size % shards:
        raise PlanError(
            f"Step {step} has a global batch of {size} examples, which {shards} data shards cannot split "
            f"evenly. Use a number of data shards that divides every batch size (here {size})."
        )
    per_shard = size // shards
    first = positions.start + data_shard * per_shard
    return range(first, first + per_shard)


def global_batch(plan: RunPlan, step: int) -> tuple[ExampleRef, ...]:
    """All examples of ``step``, in order; empty if the step is skipped."""
    positions = plan.positions(step)
    return () if plan.is_skipped(step) else examples_at(plan, positions)


def assign(plan: RunPlan, step: int, data_shard: int, num_data_shards: int | None = None) -> HostAssignment:
    """What one data shard reads at ``step``: its examples and their extents."""
    positions = slice_positions(plan, step, data_shard, num_data_shards)
    skipped = plan.is_skipped(step)
    examples, arrays = ((), None) if skipped else examples_and_arrays(plan, positions)
    found = extents(examples) if arrays is None else _extents_of(plan, arrays)
    return HostAssignment(
        step=step,
        data_shard=data_shard,
        num_data_shards=plan.num_data_shards if num_data_shards is None else num_data_shards,
        positions=positions,
        skipped=skipped,
        examples=examples,
        extents=found,
    )


def _extents_of(plan: RunPlan, arrays: ExampleArrays) -> tuple[Extent, ...]:
    tasks, shards, first_records, counts = arrays.extents()
    names = np.empty(len(plan.task_names), object)
    names[:] = plan.task_names
    return tuple(map(Extent, names[tasks].tolist(), shards.tolist(), first_records.tolist(), counts.tolist()))


def extents(examples: tuple[ExampleRef, ...]) -> tuple[Extent, ...]:
    """Groups consecutive examples that are consecutive records of one shard into extents, in order."""
    if not examples:
        return ()
    tasks = np.array([e.task for e in examples], dtype=object)
    shards = np.array([e.shard for e in examples], dtype=object)
    records = np.array([e.record for e in examples], dtype=object)
    starts = extent_starts(tasks, shards, records)
    counts = np.diff(starts, append=len(examples))
    return tuple(
        Extent(examples[s].task, examples[s].shard, examples[s].record, c)
        for s, c in zip(starts.tolist(), counts.tolist(), strict=True)
    )


def locate_example(plan: RunPlan, task: str, epoch: int, index: int) -> tuple[int, int]:
    """(step, position) at which the run reads record ``index`` of ``task`` in ``epoch``.

    PlanError if the run never reads it (a last stage that leaves the task out ends its stream).
    """
    task_index = plan.task_index(task)
    layout = plan.layouts[task_index]
    task_position = plan.epoch_order.task_position(plan.seed, task, layout.num_records, epoch, index)
    position = plan.mixing.position_of(task_index, task_position)
    return plan.step_of(position), position
