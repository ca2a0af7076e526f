"""What each data shard reads at a step: examples in order, and compact read instructions.

Step ``s`` covers stream positions ``[P(s), P(s) + B(s))``; data shard ``d`` of ``D`` reads the
contiguous slice ``d`` of it (``B(s) / D`` positions). Every position goes through the same chain:

    position --mixing--> (task, task position) --epoch order--> (epoch, record index)
             --shard layout--> (cache shard, record within the shard)

so the global batch is the same whatever ``D`` is, and the slices of a step are disjoint and make up
the global batch. ``read_runs`` compresses a slice into runs of consecutive records of one shard:
that is what a reader needs. From epoch 1 on, under the per-record epoch order, neighbouring positions
of a task are not neighbouring records, so those runs are mostly of length 1; epoch 0 reads long runs,
and so do later epochs under the block order (``taskdata.index.epoch_order``).

The chain runs on numpy arrays for a whole slice at once (``taskdata.index.arrays``); the scalar
chain is the reference, and the fallback for positions or record counts beyond int64.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from taskdata.index.arrays import ExampleArrays, example_arrays, fits_int64, run_starts
from taskdata.index.epoch_order import epoch_and_index_in, task_position_in
from taskdata.index.errors import PlanError
from taskdata.index.plan import RunPlan

__all__ = [
    "ExampleRef",
    "HostAssignment",
    "ReadRun",
    "assign",
    "examples_at",
    "global_batch",
    "locate_example",
    "read_runs",
    "slice_positions",
]

# The array path costs a fixed ~50 us, about what the scalar chain costs for 16 positions.
_SCALAR_BELOW = 16


# ExampleRef and ReadRun write their fields straight into the instance dict: a frozen dataclass's
# generated __init__ sets each field through object.__setattr__, which takes about twice as long, and
# assign builds one of each per example. Everything else (eq, hash, repr, replace, immutability) is the
# dataclass's own; a test checks that each __init__ takes exactly the fields, in order.
@dataclasses.dataclass(frozen=True, init=False)
class ExampleRef:
    """One example of the run: its stream position and where it is stored."""

    position: int
    task: str
    epoch: int
    index: int  # in the task's global (cache) order
    shard: int
    record: int  # within the shard

    def __init__(self, position: int, task: str, epoch: int, index: int, shard: int, record: int) -> None:
        self.__dict__.update(
            position=position, task=task, epoch=epoch, index=index, shard=shard, record=record
        )


@dataclasses.dataclass(frozen=True, init=False)
class ReadRun:
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
    runs: tuple[ReadRun, ...]


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


def examples_at(plan: RunPlan, positions: range) -> tuple[ExampleRef, ...]:
    """The examples at ``positions`` of the run's stream, in order (skipping does not apply here)."""
    if isinstance(positions, range) and _vectorise(plan, positions):
        return _example_refs(plan, example_arrays(plan, positions))
    return _examples_at_scalar(plan, positions)


def _vectorise(plan: RunPlan, positions: range) -> bool:
    return fits_int64(plan, positions) and len(positions) >= _SCALAR_BELOW


def _examples_at_scalar(plan: RunPlan, positions: range) -> tuple[ExampleRef, ...]:
    """The reference: one position at a time through the scalar chain (exact for any integers)."""
    mixing, layouts, names = plan.mixing, plan.layouts, plan.task_names
    out = []
    for position in positions:
        task, task_position = mixing.locate(position)
        layout = layouts[task]
        epoch, index = epoch_and_index_in(
            plan.epoch_order, plan.seed, names[task], layout.num_records, task_position
        )
        shard, record = layout.locate(index)
        out.append(ExampleRef(position, names[task], epoch, index, shard, record))
    return tuple(out)


def _example_refs(plan: RunPlan, arrays: ExampleArrays) -> tuple[ExampleRef, ...]:
    names = _task_names(plan)[arrays.tasks].tolist()
    return tuple(
        map(
            ExampleRef,
            arrays.positions,
            names,
            arrays.epochs.tolist(),
            arrays.indices.tolist(),
            arrays.shards.tolist(),
            arrays.records.tolist(),
        )
    )


def _read_runs_of(plan: RunPlan, arrays: ExampleArrays) -> tuple[ReadRun, ...]:
    tasks, shards, first_records, counts = arrays.runs()
    names = _task_names(plan)[tasks].tolist()
    return tuple(map(ReadRun, names, shards.tolist(), first_records.tolist(), counts.tolist()))


def _task_names(plan: RunPlan) -> np.ndarray:
    names = np.empty(len(plan.task_names), object)
    names[:] = plan.task_names
    return names


def global_batch(plan: RunPlan, step: int) -> tuple[ExampleRef, ...]:
    """All examples of ``step``, in order; empty if the step is skipped."""
    positions = plan.positions(step)
    return () if plan.is_skipped(step) else examples_at(plan, positions)


def assign(plan: RunPlan, step: int, data_shard: int, num_data_shards: int | None = None) -> HostAssignment:
    """What one data shard reads at ``step``: its examples and the read instructions for them."""
    positions = slice_positions(plan, step, data_shard, num_data_shards)
    skipped = plan.is_skipped(step)
    if skipped:
        examples: tuple[ExampleRef, ...] = ()
        runs: tuple[ReadRun, ...] = ()
    elif _vectorise(plan, positions):
        arrays = example_arrays(plan, positions)
        examples, runs = _example_refs(plan, arrays), _read_runs_of(plan, arrays)
    else:
        examples = _examples_at_scalar(plan, positions)
        runs = read_runs(examples)
    return HostAssignment(
        step=step,
        data_shard=data_shard,
        num_data_shards=plan.num_data_shards if num_data_shards is None else num_data_shards,
        positions=positions,
        skipped=skipped,
        examples=examples,
        runs=runs,
    )


def read_runs(examples: tuple[ExampleRef, ...]) -> tuple[ReadRun, ...]:
    """Groups consecutive examples that are consecutive records of one shard, keeping their order."""
    if not examples:
        return ()
    tasks = np.array([e.task for e in examples], dtype=object)
    shards = np.array([e.shard for e in examples], dtype=object)
    records = np.array([e.record for e in examples], dtype=object)
    starts = run_starts(tasks, shards, records)
    counts = np.diff(starts, append=len(examples))
    return tuple(
        ReadRun(examples[s].task, examples[s].shard, examples[s].record, c)
        for s, c in zip(starts.tolist(), counts.tolist(), strict=True)
    )


def locate_example(plan: RunPlan, task: str, epoch: int, index: int) -> tuple[int, int]:
    """(step, position) at which the run reads record ``index`` of ``task`` in ``epoch``.

    PlanError if the run never reads it (a last stage that leaves the task out ends its stream).
    """
    task_index = plan.task_index(task)
    layout = plan.layouts[task_index]
    task_position = task_position_in(plan.epoch_order, plan.seed, task, layout.num_records, epoch, index)
    position = plan.mixing.position_of(task_index, task_position)
    return plan.step_of(position), position
