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
import weakref
from collections.abc import Sequence

import numpy as np

from taskdata.index.errors import PlanError
from taskdata.index.permutation import _epoch_permutation, permute_many
from taskdata.index.plan import RunPlan

__all__ = ["ExampleArrays", "ShardFinder", "example_arrays", "fits_int64", "run_starts"]

_INT64_LIMIT = 2**63


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

    def grouped_runs(self, num_parts: int, num_tasks: int) -> tuple[np.ndarray, ...]:
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
        and positions.stop < _INT64_LIMIT
        and _tables(plan).total_records < _INT64_LIMIT
    )


def example_arrays(plan: RunPlan, positions: range) -> ExampleArrays:
    """The examples at ``positions`` (a contiguous range), as arrays; equal to ``examples_at``."""
    if not isinstance(positions, range) or not fits_int64(plan, positions):
        raise PlanError(
            f"example_arrays needs a range of step 1 within [0, 2**63) over a plan with fewer than 2**63 "
            f"records in all, but got {positions!r} for run {plan.name!r}. Use examples_at: it is exact for "
            "any positions."
        )
    tables = _tables(plan)
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
    """Record indices of positions past epoch 0: one ``permute_many`` over their (task, epoch) pairs."""
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
    permutations = [
        _epoch_permutation(plan.seed, names[task], epoch, layouts[task].num_records)
        for task, epoch in zip(sorted_tasks[firsts].tolist(), sorted_epochs[firsts].tolist(), strict=True)
    ]
    return permute_many(permutations, which, offsets)


class ShardFinder:
    """Which shard holds each record: ``searchsorted(ends, indices, side="right")``, in fewer reads.

    Tasks' shards are laid end to end; ``ends`` are their cumulative record counts. A binary search over
    100,000s of shards takes ~18 scattered reads per index, cache misses once a server's other data has
    evicted the table. Here each task's records are cut into buckets of about one of its non-empty
    shards' size; ``first[b]`` is the first non-empty shard that may hold bucket ``b``'s records, and at
    most ``span`` steps to the right (one vectorized compare each) find the one that does: 3-4 reads per
    index. Empty shards hold no record and are left out. Tasks whose shards differ so much in size that
    one bucket crosses more than ``MAX_SPAN`` shards make the whole plan use the binary search.
    """

    MAX_SPAN = 8

    def __init__(self, counts_per_task: Sequence[np.ndarray]):
        counts = (
            np.concatenate([np.asarray(c, np.int64) for c in counts_per_task]) if counts_per_task else None
        )
        self.ends = np.cumsum(counts) if counts is not None else np.zeros(0, np.int64)
        self.nonempty = np.flatnonzero(counts) if counts is not None else np.zeros(0, np.int64)
        self.nonempty_ends = self.ends[self.nonempty]
        firsts, widths, record_bases, bucket_bases = [], [], [], []
        record_base = bucket_base = 0
        self.span = 0
        for task_counts in counts_per_task:
            records = int(np.sum(task_counts))
            width = max(1, records // max(1, int(np.count_nonzero(task_counts))))
            starts = record_base + np.arange(records // width + 2, dtype=np.int64) * width
            first = np.searchsorted(self.nonempty_ends, starts, side="right")
            # The last buckets reach past the task: no record of it lies beyond its last shard.
            last = np.searchsorted(self.nonempty_ends, record_base + max(0, records - 1), side="right")
            np.minimum(first, last, out=first)
            self.span = max(self.span, int(np.diff(first).max(initial=0)))
            firsts.append(first)
            widths.append(width)
            record_bases.append(record_base)
            bucket_bases.append(bucket_base)
            record_base += records
            bucket_base += len(first)
        self.first = np.concatenate(firsts) if firsts else np.zeros(0, np.int64)
        self.widths = np.array(widths, np.int64)
        self.record_bases = np.array(record_bases, np.int64)
        self.bucket_bases = np.array(bucket_bases, np.int64)

    def find(self, indices: np.ndarray, tasks: np.ndarray) -> np.ndarray:
        """For indices into the records laid end to end, each of task ``tasks[i]``: its shard (into ``ends``)."""
        if self.span > self.MAX_SPAN:
            return np.searchsorted(self.ends, indices, side="right")
        widths = self.widths[tasks]
        at = self.first[self.bucket_bases[tasks] + (indices - self.record_bases[tasks]) // widths]
        # The index lies in non-empty shards first[b] .. first[b + 1]: step right while the shard ends
        # at or before it (never past the right shard, which ends after it).
        for _ in range(self.span):
            at += self.nonempty_ends[at] <= indices
        return self.nonempty[at]


@dataclasses.dataclass(frozen=True, eq=False)
class _Tables:
    """Per plan: record counts per task, and every shard of every task laid end to end."""

    num_records: np.ndarray  # per task
    record_base: np.ndarray  # per task: where its records start in the concatenation
    shard_base: np.ndarray  # per task: its first shard's number in the concatenation
    shard_starts: np.ndarray  # per concatenated shard
    shard_finder: ShardFinder  # record index in the concatenation -> concatenated shard
    total_records: int


# Built once per plan object and dropped with it (with 65,536 shards per task they take megabytes).
# Keyed by identity: a plan's hash is its fingerprint, which costs more than these tables to compute.
_TABLES: dict[int, _Tables] = {}


def _tables(plan: RunPlan) -> _Tables:
    tables = _TABLES.get(id(plan))
    if tables is None:
        tables = _TABLES[id(plan)] = _build_tables(plan)
        weakref.finalize(plan, _TABLES.pop, id(plan), None)
    return tables


def _build_tables(plan: RunPlan) -> _Tables:
    num_records = [layout.num_records for layout in plan.layouts]
    total = sum(num_records)
    if total >= _INT64_LIMIT:
        empty = np.empty(0, np.int64)
        return _Tables(empty, empty, empty, empty, ShardFinder([]), total)
    finder = ShardFinder([np.array(layout.record_counts, np.int64) for layout in plan.layouts])
    return _Tables(
        num_records=np.array(num_records, np.int64),
        record_base=finder.record_bases,
        shard_base=np.cumsum([0, *(layout.num_shards for layout in plan.layouts[:-1])], dtype=np.int64),
        shard_starts=np.concatenate(([0], finder.ends[:-1])),
        shard_finder=finder,
        total_records=total,
    )
