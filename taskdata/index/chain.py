"""The index chain: where the run reads each stream position, through three links the plan chooses.

    position --mixing--> (task, task position) --epoch order--> (epoch, record index)
             --shard layout--> (cache shard, record within the shard)

Each link is one interface whatever the plan holds: ``plan.mixing`` (a ``StagedMixing``: every stage's
rates), ``plan.epoch_order`` (an ``EpochOrder`` of ``taskdata.index.orders``: which permutation each
epoch past 0 reads) and the shard layouts (``plan.layouts``, or ``plan.tables`` for arrays). The chain is
computed two ways that tests hold equal:

- ``locate``: one position, Python ints: the reference, exact for any integers;
- ``example_arrays`` and ``task_extents``: a range of positions at once, numpy int64, while positions and
  the plan's records stay below 2**63 (``fits_int64``; ``task_extents`` takes the reference beyond).

Arrays go task by task (``_records``): within a contiguous range of positions, each task's examples are
consecutive positions of its own stream, ``[a_t, a_t + n_t)`` with ``a_t`` the task's examples before the
range (``Mixing.counts``). So the mixing gives only which task each position holds (``tasks_in_range``);
a task's positions are cut into the epochs they fall in, in Python (a few per task and range); each
epoch's record indices are one ``arange``, and every epoch past 0 of every task goes through one
``EpochOrder.apply`` call; then one ``ShardFinder.find`` over every shard of every task.
``example_arrays`` puts the results back in position order; ``task_extents`` cuts them into extents.

An *extent* is consecutive records of one cache shard (a first record and a count), read with one
ranged read: what a reader needs. Under the per-record order, neighbouring positions of a task in a
later epoch are not neighbouring records, so those extents are mostly of one record; epoch 0 reads long
extents, and so do later epochs under the block order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from taskdata.index.errors import PlanError
from taskdata.index.orders import EpochPermutation
from taskdata.index.plan import RunPlan
from taskdata.index.tables import INT64_LIMIT

__all__ = [
    "ExampleArrays",
    "ExampleRef",
    "example_arrays",
    "examples_and_arrays",
    "examples_at",
    "extent_starts",
    "fits_int64",
    "locate",
    "task_extents",
]

# The array path costs a fixed ~50 us, about what the scalar chain costs for 16 positions.
_SCALAR_BELOW = 16


# ExampleRef writes its fields straight into the instance dict: a frozen dataclass's generated __init__
# sets each field through object.__setattr__, which takes about twice as long, and examples_at builds one
# per example. Everything else (eq, hash, repr, replace, immutability) is the dataclass's own; a test
# checks that __init__ takes exactly the fields, in order.
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


def locate(plan: RunPlan, position: int) -> ExampleRef:
    """The example at stream ``position``: the chain one link at a time, on Python ints (exact for any)."""
    task, task_position = plan.mixing.locate(position)
    layout, name = plan.layouts[task], plan.task_names[task]
    epoch, index = plan.epoch_order.epoch_and_index(plan.seed, name, layout.num_records, task_position)
    shard, record = layout.locate(index)
    return ExampleRef(position, name, epoch, index, shard, record)


def examples_at(plan: RunPlan, positions: Iterable[int]) -> tuple[ExampleRef, ...]:
    """The examples at ``positions`` of the run's stream, in order (skipping does not apply here)."""
    return examples_and_arrays(plan, positions)[0]


def examples_and_arrays(
    plan: RunPlan, positions: Iterable[int]
) -> tuple[tuple[ExampleRef, ...], ExampleArrays | None]:
    """``examples_at``, and the arrays it made them from (None where it took ``locate``: positions that
    are few, not a range, or beyond int64)."""
    if not (isinstance(positions, range) and fits_int64(plan, positions) and len(positions) >= _SCALAR_BELOW):
        return tuple(locate(plan, position) for position in positions), None
    arrays = example_arrays(plan, positions)
    names = np.empty(len(plan.task_names), object)
    names[:] = plan.task_names
    refs = map(
        ExampleRef,
        arrays.positions,
        names[arrays.tasks].tolist(),
        arrays.epochs.tolist(),
        arrays.indices.tolist(),
        arrays.shards.tolist(),
        arrays.records.tolist(),
    )
    return tuple(refs), arrays


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

    def extents(self, task: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Extents as arrays ``(tasks, shards, first_records, counts)``, in order.

        Of all examples, these are ``taskdata.index.extents`` of the whole range. Of one ``task`` (an index
        into ``plan.task_names``), they are the extents of that task's examples alone: its consecutive
        records make one extent even when other tasks' examples fall between them.
        """
        tasks, shards, records = self.tasks, self.shards, self.records
        if task is not None:
            own = np.flatnonzero(tasks == task)
            tasks, shards, records = tasks[own], shards[own], records[own]
        starts = extent_starts(tasks, shards, records)
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


def extent_starts(tasks: np.ndarray, shards: np.ndarray, records: np.ndarray) -> np.ndarray:
    """Where extents start: example 0, and every example that is not the record after the previous one.

    ``tasks`` may hold task indices or names (an object array); the result indexes the examples.
    """
    if not len(tasks):
        return np.empty(0, np.int64)
    new_extent = np.empty(len(tasks), bool)
    new_extent[0] = True
    np.not_equal(records[1:], records[:-1] + 1, out=new_extent[1:])
    new_extent[1:] |= shards[1:] != shards[:-1]
    new_extent[1:] |= tasks[1:] != tasks[:-1]
    return np.flatnonzero(new_extent)


def fits_int64(plan: RunPlan, positions: range) -> bool:
    """Whether the arrays compute ``positions`` (contiguous, and int64 is exact for them)."""
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
    start, size = positions.start, max(0, len(positions))
    tasks = plan.mixing.tasks_in_range(start, start + size)
    per_task = np.bincount(tasks, minlength=len(plan.task_names)).tolist()
    indices, epochs, shards, records = _records(plan, start, per_task, size, with_epochs=True)
    assert epochs is not None
    # Task by task, each task's examples in position order: a stable sort of the positions by task.
    by_task = tasks.argsort(kind="stable")
    out = np.empty((4, size), np.int64)
    for row, values in zip(out, (epochs, indices, shards, records), strict=True):
        row[by_task] = values
    return ExampleArrays(start, tasks, *out)


def task_extents(
    plan: RunPlan, positions: range, parts: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(bounds, shards, first_records, counts, tasks)`` of ``positions`` cut into ``parts`` equal slices.

    The extents of group ``g = t * parts + p`` (task ``t``, slice ``p``) are entries ``bounds[g]`` to
    ``bounds[g + 1]`` of ``shards``, ``first_records`` and ``counts``: task ``t``'s examples of slice
    ``p``, its consecutive records one extent even when other tasks' examples fall between them.
    ``tasks`` holds the task index of every position, in order. ``len(positions)`` must split evenly.
    """
    if not fits_int64(plan, positions):
        return _task_extents_scalar(plan, positions, parts)
    start, size = positions.start, len(positions)
    num_tasks = len(plan.task_names)
    tasks = plan.mixing.tasks_in_range(start, start + size)
    if parts == 1:
        per_group = np.bincount(tasks, minlength=num_tasks)
        per_task = per_group.tolist()
    else:
        # Group of each position: its task, then its slice.
        groups = np.arange(size, dtype=np.int64) // (size // parts)
        groups += tasks * parts
        per_group = np.bincount(groups, minlength=num_tasks * parts)
        per_task = per_group.reshape(num_tasks, parts).sum(axis=1).tolist()
    _, _, shards, records = _records(plan, start, per_task, size, with_epochs=False)
    # An extent starts at every group's first example, and wherever the record is not the next of the same shard.
    group_starts = np.zeros(len(per_group) + 1, np.int64)
    per_group.cumsum(out=group_starts[1:])
    new_extent = np.empty(size + 1, bool)
    np.not_equal(records[1:], records[:-1] + 1, out=new_extent[1:size])
    new_extent[1:size] |= shards[1:] != shards[:-1]
    new_extent[group_starts] = True
    # (Array methods rather than np.flatnonzero, np.diff...: their Python wrappers cost as much as the work.)
    starts = new_extent.nonzero()[0]
    counts = starts[1:] - starts[:-1]
    starts = starts[:-1]
    bounds = starts.searchsorted(group_starts)
    return bounds, shards[starts], records[starts], counts, tasks


def _task_extents_scalar(
    plan: RunPlan, positions: range, parts: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``task_extents`` through ``locate``, for positions beyond int64 (shards and records stay small)."""
    index = {name: t for t, name in enumerate(plan.task_names)}
    per_slice = len(positions) // parts
    groups: list[list[list[int]]] = [[] for _ in range(len(index) * parts)]
    order = []
    for i, position in enumerate(positions):
        example = locate(plan, position)
        t = index[example.task]
        order.append(t)
        extents = groups[t * parts + i // per_slice]  # [shard, first record, count] each
        if extents and extents[-1][0] == example.shard and extents[-1][1] + extents[-1][2] == example.record:
            extents[-1][2] += 1
        else:
            extents.append([example.shard, example.record, 1])
    table = np.array([e for extents in groups for e in extents], np.int64).reshape(-1, 3)
    bounds = np.cumsum([0] + [len(extents) for extents in groups])
    return bounds, table[:, 0], table[:, 1], table[:, 2], np.array(order, np.int64)


def _records(
    plan: RunPlan, start: int, per_task: list[int], size: int, *, with_epochs: bool
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """``(indices, epochs, shards, records)`` of the ``size`` examples from stream position ``start`` on,
    task by task (task ``t`` holds ``per_task[t]`` of them, in its stream's order): each one's record index
    in its task's cache order, its epoch (None unless ``with_epochs``), its shard and its record there."""
    before = plan.mixing.counts(start)
    order, seed, names = plan.epoch_order, plan.seed, plan.task_names
    lengths: list[int] = []  # per piece: a task's examples in one epoch
    shifts: list[int] = []  # per piece: its first record index minus its first entry's place
    piece_epochs: list[int] = []
    permuted: list[int] = []  # the pieces past epoch 0
    permutations: list[EpochPermutation] = []  # theirs, in the plan's epoch order
    done = 0
    records_per_task = plan.tables.num_records.tolist()
    for task, (first, count, num_records) in enumerate(zip(before, per_task, records_per_task, strict=True)):
        if not count:
            continue
        epoch, offset = divmod(first, num_records)
        while count:
            length = min(count, num_records - offset)
            if epoch:
                permuted.append(len(lengths))
                permutations.append(order.permutation(seed, names[task], epoch, num_records))
            lengths.append(length)
            shifts.append(offset - done)
            piece_epochs.append(epoch)
            done += length
            count -= length
            epoch, offset = epoch + 1, 0
    indices = np.arange(size, dtype=np.int64)
    if len(lengths) == 1:
        indices += shifts[0]
    elif lengths:
        indices += np.array(shifts, np.int64).repeat(lengths)
    if permuted:
        # Every piece past epoch 0 through its permutation, in one call.
        which = np.arange(len(permuted), dtype=np.int64).repeat([lengths[piece] for piece in permuted])
        if len(permuted) == len(lengths):
            indices = order.apply(permutations, which, indices)
        else:
            mine = np.zeros(len(lengths), bool)
            mine[permuted] = True
            where = mine.repeat(lengths).nonzero()[0]
            indices[where] = order.apply(permutations, which, indices[where])
    epochs = np.array(piece_epochs, np.int64).repeat(lengths) if with_epochs else None
    tables = plan.tables
    task_of = np.arange(len(per_task), dtype=np.int64).repeat(per_task)
    global_indices = indices + tables.record_base[task_of]
    global_shards = tables.shard_finder.find(global_indices, task_of)
    global_indices -= tables.shard_starts[global_shards]  # records within their shards now
    global_shards -= tables.shard_base[task_of]
    return indices, epochs, global_shards, global_indices
