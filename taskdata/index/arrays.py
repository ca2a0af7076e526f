"""The index chain over a contiguous range of stream positions, computed for all positions at once.

``examples_at`` and ``assign`` build their ``ExampleRef`` and ``ReadRun`` objects from these arrays.
The chain is the scalar one (``Mixing.locate``, ``epoch_and_index``, ``ShardLayout.locate``), with
numpy doing each step for every position of the range:

- mixing: ``Mixing.locate_range`` splits the range node by node (one Bresenham step per tree node);
- epochs: one division per position; all positions past epoch 0, of every task and epoch, go
  through one ``permute_many`` call;
- layout: one ``ShardFinder.find`` over the cumulative record counts of every shard of every task;
- read runs: a run ends where the next example is not the next record of the same shard.

Arrays are int64, so a range is handled here only while its positions and the plan's total number
of records stay below 2**63 (``fits_int64``); callers fall back to the scalar chain beyond that.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from taskdata.index.block_order import block_permute_many
from taskdata.index.epoch_order import block_permutation, windowed_permutation
from taskdata.index.errors import PlanError
from taskdata.index.permutation import _epoch_permutation, permute_many
from taskdata.index.plan import RunPlan
from taskdata.index.tables import INT64_LIMIT
from taskdata.index.windowed_order import windowed_permute_many

__all__ = ["ExampleArrays", "example_arrays", "fits_int64", "run_starts"]


@dataclasses.dataclass(frozen=True, eq=False)
class ExampleArrays:
    """The examples at positions ``start, start + 1, ...``: one read-only int64 array per field.

    ``tasks`` holds indices into ``plan.task_names``; the other fields mean what they mean in
    ``ExampleRef``. Instances compare by identity: compare their arrays to compare contents.
    """

    start: int
    tasks: np.ndarray
    epochs: np.ndarray
    indices: np.ndarray
    shards: np.ndarray
    records: np.ndarray

    def __post_init__(self) -> None:
        if isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < 0:
            raise PlanError(f"ExampleArrays start must be an integer >= 0 but got {self.start!r}.")
        length = len(self.tasks)
        for field in ("tasks", "epochs", "indices", "shards", "records"):
            array = getattr(self, field)
            if not isinstance(array, np.ndarray) or array.dtype != np.int64 or array.shape != (length,):
                raise PlanError(
                    f"ExampleArrays.{field} must be a 1-D int64 array of length {length} (that of tasks) but "
                    f"got {array!r}."
                )
            array.flags.writeable = False

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def positions(self) -> range:
        return range(self.start, self.start + len(self.tasks))

    def runs(self, task: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Read runs as arrays ``(tasks, shards, first_records, counts)``, in order.

        Of all examples, these are ``read_runs`` of the whole range. Of one ``task`` (an index into
        ``plan.task_names``), they are ``read_runs`` of that task's examples alone: its consecutive
        records make one run even when other tasks' examples fall between them.
        """
        tasks, shards, records = self.tasks, self.shards, self.records
        if task is not None:
            own = np.flatnonzero(tasks == task)
            tasks, shards, records = tasks[own], shards[own], records[own]
        starts = run_starts(tasks, shards, records)
        counts = np.empty_like(starts)
        counts[:-1] = starts[1:] - starts[:-1]
        counts[-1:] = len(tasks) - starts[-1:]
        return tasks[starts], shards[starts], records[starts], counts

    def cut(self, a: int, b: int) -> ExampleArrays:
        """The examples ``a .. b - 1`` of these (positions ``start + a ..``), as views."""
        a, b, _ = slice(a, b).indices(len(self))
        return ExampleArrays(
            self.start + a,
            self.tasks[a:b],
            self.epochs[a:b],
            self.indices[a:b],
            self.shards[a:b],
            self.records[a:b],
        )

    def grouped_runs(
        self, num_parts: int, num_tasks: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Read runs grouped by (part, task), for every part and task at once: one stable sort, one pass.

        The examples are cut into ``num_parts`` equal consecutive parts (a step's data shards); the runs
        of part ``p`` and task index ``t`` are ``cut(part p).runs(t)``. Returns ``(bounds, shards,
        first_records, counts)``: those runs are entries ``bounds[p * num_tasks + t]`` up to
        ``bounds[p * num_tasks + t + 1]`` of the three other arrays.
        """
        size = len(self)
        if num_parts < 1 or size % num_parts:
            raise PlanError(f"{size} examples cannot be cut into {num_parts} equal parts.")
        group = np.arange(size) // max(1, size // num_parts) * num_tasks + self.tasks
        by_group = np.argsort(group, kind="stable")
        group, shards, records = group[by_group], self.shards[by_group], self.records[by_group]
        starts = run_starts(group, shards, records)
        counts = np.empty_like(starts)
        counts[:-1] = starts[1:] - starts[:-1]
        counts[-1:] = size - starts[-1:]
        bounds = np.searchsorted(group[starts], np.arange(num_parts * num_tasks + 1))
        return bounds, shards[starts], records[starts], counts


def run_starts(tasks: np.ndarray, shards: np.ndarray, records: np.ndarray) -> np.ndarray:
    """Where read runs start: example 0, and every example that is not the record after the previous one.

    ``tasks`` may hold task indices or names (an object array); the result indexes the examples.
    """
    if not len(tasks):
        return np.empty(0, np.int64)
    new_run = np.empty(len(tasks), bool)
    new_run[0] = True
    np.not_equal(records[1:], records[:-1] + 1, out=new_run[1:])
    new_run[1:] |= shards[1:] != shards[:-1]
    new_run[1:] |= tasks[1:] != tasks[:-1]
    return np.flatnonzero(new_run)


def fits_int64(plan: RunPlan, positions: range) -> bool:
    """Whether ``example_arrays`` handles ``positions`` (contiguous, and int64 is exact for them)."""
    return (
        positions.step == 1
        and positions.start >= 0
        and positions.stop < INT64_LIMIT
        and plan.tables.total_records < INT64_LIMIT
    )


def example_arrays(plan: RunPlan, positions: range) -> ExampleArrays:
    """The examples at ``positions`` (a contiguous range), as arrays; equal to ``examples_at``."""
    if not isinstance(positions, range) or not fits_int64(plan, positions):
        raise PlanError(
            f"example_arrays needs a range of step 1 within [0, 2**63) over a plan with fewer than 2**63 "
            f"records in all, but got {positions!r} for run {plan.name!r}. Use examples_at: it is exact for "
            "any positions."
        )
    tables = plan.tables
    start, stop = positions.start, max(positions.start, positions.stop)
    tasks, task_positions = plan.mixing.locate_range(start, stop)
    num_records = tables.num_records[tasks]
    epochs = task_positions // num_records
    indices = task_positions - epochs * num_records
    permuted = np.flatnonzero(epochs)
    if permuted.size:
        indices[permuted] = _permute(plan, tasks[permuted], epochs[permuted], indices[permuted])
    global_indices = indices + tables.record_base[tasks]
    global_shards = tables.shard_finder.find(global_indices, tasks)
    return ExampleArrays(
        start=start,
        tasks=tasks,
        epochs=epochs,
        indices=indices,
        shards=global_shards - tables.shard_base[tasks],
        records=global_indices - tables.shard_starts[global_shards],
    )


def _permute(plan: RunPlan, tasks: np.ndarray, epochs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Record indices of positions past epoch 0: one ``permute_many`` (``block_permute_many`` under the block
    epoch order, ``windowed_permute_many`` under the windowed one) over their (task, epoch) pairs."""
    # Sorting by (task, epoch) numbers the distinct pairs; Python then only touches each pair once.
    order = np.lexsort((epochs, tasks))
    sorted_tasks, sorted_epochs = tasks[order], epochs[order]
    new_pair = np.empty(len(order), bool)
    new_pair[0] = True
    np.not_equal(sorted_tasks[1:], sorted_tasks[:-1], out=new_pair[1:])
    new_pair[1:] |= sorted_epochs[1:] != sorted_epochs[:-1]
    which = np.empty_like(order)
    which[order] = np.cumsum(new_pair) - 1
    firsts = np.flatnonzero(new_pair)
    names, layouts = plan.task_names, plan.layouts
    pairs = list(zip(sorted_tasks[firsts].tolist(), sorted_epochs[firsts].tolist(), strict=True))
    epoch_order = plan.epoch_order
    if epoch_order.kind == "windowed":
        size, width = epoch_order.block_size, epoch_order.width
        assert size is not None and width is not None
        windows = [
            windowed_permutation(plan.seed, names[task], epoch, layouts[task].num_records, size, width)
            for task, epoch in pairs
        ]
        return windowed_permute_many(windows, which, offsets)
    block_size = epoch_order.block_size
    if block_size is not None:
        blocks = [
            block_permutation(plan.seed, names[task], epoch, layouts[task].num_records, block_size)
            for task, epoch in pairs
        ]
        return block_permute_many(blocks, which, offsets)
    permutations = [
        _epoch_permutation(plan.seed, names[task], epoch, layouts[task].num_records) for task, epoch in pairs
    ]
    return permute_many(permutations, which, offsets)
