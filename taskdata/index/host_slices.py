"""A step's reads, computed for its host slices: positions -> extents (``chain.task_extents``) -> byte ranges.

``step_slices(tables, step, count)`` computes a whole step at once, cut into ``count`` equal consecutive
host slices: the extents of every (task, slice) in one pass, their byte ranges in one gather per task,
and, when a slice is first cut, each group's shard files in one pass. The assignment server computes a
step this way once and writes every host's answer from it. ``step_slices(..., only=index)`` computes
one slice alone (what a host computing its own reads needs), as a ``StepSlices`` of that one slice;
both give equal values for a slice (a ``StepReads``: ``taskdata.index.step_reads``).

Within a slice, a task's consecutive records make one read (one extent) even when other tasks'
examples fall between them, so a coarser slice is not the concatenation of its finer slices' reads:
at the seams their reads join.

Nothing here reads a file: byte ranges come from a ``ShardTable`` per task (the server's verified
``taskdata.runs.ResolvedCache``, or the trainer client's view of a cache reader).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from taskdata.index.assign import slice_positions
from taskdata.index.chain import task_extents
from taskdata.index.errors import PlanError
from taskdata.index.plan import RunPlan, data_shard_for_host
from taskdata.index.step_reads import READ_COLUMNS, CacheFiles, StepReads, assemble

__all__ = ["RunTables", "ShardTable", "StepSlices", "host_slice_for", "step_slices"]

# Up to this many (host slice, task, shard) triples, a step's files are found in a table of all of them.
_PRESENCE_LIMIT = 2**16


class ShardTable(Protocol):
    """One task's cache version as the index math needs it: names, shard files, and record byte ranges."""

    @property
    def task(self) -> str: ...

    @property
    def version(self) -> str:
        """The version folder's name."""
        ...

    @property
    def shard_uris(self) -> Sequence[str]:
        """Shard ``s``'s file is ``shard_uris[s]``."""
        ...

    def byte_ranges(
        self, shards: np.ndarray, first_records: np.ndarray, counts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(byte offsets, byte lengths) of records ``[first_records[i], first_records[i] + counts[i])`` of
        ``shards[i]``, as int64 arrays."""
        ...


@dataclasses.dataclass(frozen=True, eq=False)
class RunTables:
    """A run's plan with the shard table and the ``CacheFiles`` of each of its tasks, in the plan's order.

    Build one per run (``of``) and keep it: ``CacheFiles`` encodes its files' JSON once. A server with
    several runs over one cache version may share that version's ``CacheFiles`` between them.
    """

    plan: RunPlan
    tables: tuple[ShardTable, ...]
    files: tuple[CacheFiles, ...]

    def __post_init__(self) -> None:
        names = list(self.plan.task_names)
        for what, got in (
            ("shard tables", [t.task for t in self.tables]),
            ("files", [f.task for f in self.files]),
        ):
            if got != names:
                raise PlanError(f"Run {self.plan.name!r} reads tasks {names} but its {what} are of {got}.")
        for table, files, layout in zip(self.tables, self.files, self.plan.layouts, strict=True):
            every = np.arange(layout.num_shards)
            if len(table.shard_uris) != layout.num_shards or not np.array_equal(files.shards, every):
                raise PlanError(
                    f"Run {self.plan.name!r} plans {layout.num_shards} shards of task {table.task!r} but its "
                    f"cache version {table.version!r} has {len(table.shard_uris)} (and {len(files.shards)} files)."
                )

    @classmethod
    def of(cls, plan: RunPlan, tables: Sequence[ShardTable]) -> RunTables:
        files = tuple(CacheFiles.of(t.task, t.version, t.shard_uris) for t in tables)
        return cls(plan, tuple(tables), files)


@dataclasses.dataclass(frozen=True, eq=False)
class StepSlices:
    """The reads of a step cut into ``count`` equal consecutive host slices; ``slices[i]`` is slice ``i``.

    ``columns`` has one row per name of ``READ_COLUMNS`` and one column per read. The reads of slice
    ``p`` and task ``t`` are columns ``bounds[g]`` to ``bounds[g + 1]``, ``g = t * count + p``;
    ``order`` holds every example's task index; slice ``p``'s are ``order[p * per_slice:(p + 1) * per_slice]``.
    The shards each group reads (its ``TaskReads.files``) are found on first use (``files_read``), by the
    first cut or by ``StepJson`` writing base64 answers; compact answers, written from the columns, never
    need them.
    """

    step: int
    skipped: bool
    global_batch_size: int
    start: int  # the first position of slice 0
    per_slice: int
    count: int
    files: tuple[CacheFiles, ...]
    bounds: list[int]
    columns: np.ndarray
    order: np.ndarray

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> StepReads:
        if not 0 <= index < self.count:
            raise IndexError(f"Step {self.step} has {self.count} host slices; there is no slice {index}.")
        bounds, columns = self.bounds, self.columns
        file_bounds, file_shards = self.files_read
        tasks = []
        for t, files in enumerate(self.files):
            g = t * self.count + index
            tasks.append(
                (
                    files,
                    file_shards[file_bounds[g] : file_bounds[g + 1]],
                    columns[:, bounds[g] : bounds[g + 1]],
                )
            )
        size = self.per_slice
        first = self.start + index * size
        taken = 0 if self.skipped else size
        return assemble(
            self.step,
            self.skipped,
            self.global_batch_size,
            range(first, first + size),
            tasks,
            self.order[index * taken : (index + 1) * taken],
        )

    @functools.cached_property
    def files_read(self) -> tuple[list[int], np.ndarray]:
        """(file bounds, file shards): the shards group ``g`` reads, ascending, each once, are
        ``file_shards[file_bounds[g]:file_bounds[g + 1]]``."""
        bounds = np.array(self.bounds, np.int64)
        groups, shards = len(bounds) - 1, self.columns[0]
        group_of_read = np.arange(groups).repeat(bounds[1:] - bounds[:-1])
        stride = max((len(files.shards) for files in self.files), default=1)
        if groups * stride <= _PRESENCE_LIMIT:
            # Few shards: mark the pairs read in a table of every pair and read it back in order (no sort).
            present = np.zeros((groups, stride), bool)
            present[group_of_read, shards] = True
            group_of_file, file_shards = present.nonzero()
        else:
            pairs = np.sort(group_of_read * stride + shards)
            if len(pairs):
                pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))]
            group_of_file, file_shards = pairs // stride, pairs % stride
        file_shards.flags.writeable = False
        return group_of_file.searchsorted(np.arange(groups + 1)).tolist(), file_shards


def step_slices(tables: RunTables, step: int, count: int, *, only: int | None = None) -> StepSlices:
    """``step``'s reads for each of ``count`` equal consecutive host slices, computed together; or, with
    ``only``, host slice ``only`` of ``count`` computed alone, as the one slice of the ``StepSlices``."""
    if only is None:
        return _compute(tables, step, tables.plan.positions(step), count)
    return _compute(tables, step, slice_positions(tables.plan, step, only, count), 1)


def _compute(tables: RunTables, step: int, positions: range, parts: int) -> StepSlices:
    plan = tables.plan
    size = len(positions)
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1 or size % parts:
        raise PlanError(
            f"Step {step} of run {plan.name!r}: {size} positions cannot be cut into {parts!r} equal host "
            f"slices. Use a number of hosts that divides the batch size."
        )
    skipped = plan.is_skipped(step)
    if skipped:
        bounds = np.zeros(parts * len(tables.tables) + 1, np.int64)
        shards = firsts = counts = order = np.zeros(0, np.int64)
    else:
        bounds, shards, firsts, counts, order = task_extents(plan, positions, parts)
    # Little-endian int64 rows: a row's slice is already the bytes encoding=base64 writes.
    columns = np.empty((len(READ_COLUMNS), len(shards)), "<i8")
    columns[0], columns[1], columns[2] = shards, firsts, counts
    ends = bounds[::parts].tolist()  # task t's extents are ends[t] to ends[t + 1]
    for t, table in enumerate(tables.tables):
        a, b = ends[t], ends[t + 1]
        columns[3, a:b], columns[4, a:b] = table.byte_ranges(shards[a:b], firsts[a:b], counts[a:b])
    order = order.astype("<i8", copy=False)
    for array in (columns, order):
        array.flags.writeable = False
    return StepSlices(
        step=step,
        skipped=skipped,
        global_batch_size=plan.batch_size(step),
        start=positions.start,
        per_slice=size // parts,
        count=parts,
        files=tables.files,
        bounds=bounds.tolist(),
        columns=columns,
        order=order,
    )


def host_slice_for(host: int, num_hosts: int, num_data_shards: int) -> tuple[int, int]:
    """(index, count): the host slice that ``host`` of ``num_hosts`` reads of a run of ``num_data_shards``.

    More hosts than data shards (a multiple): consecutive hosts share one data shard, as the hosts of
    one model replica do (``data_shard_for_host``). Fewer (a divisor): host ``h`` reads the ``num_data_shards
    / num_hosts`` consecutive data shards from ``h * num_data_shards / num_hosts`` on, as one slice; the
    global batch does not depend on how it is cut, so that slice is the union of those data shards.
    """
    for value, what in ((num_hosts, "Number of hosts"), (num_data_shards, "Number of data shards")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{what} must be a positive integer but got {value!r}.")
    if num_hosts % num_data_shards == 0:
        return data_shard_for_host(host, num_hosts, num_data_shards), num_data_shards
    if num_data_shards % num_hosts == 0:
        if isinstance(host, bool) or not isinstance(host, int) or not 0 <= host < num_hosts:
            raise PlanError(f"Host must be an integer in [0, {num_hosts}) but got {host!r}.")
        return host, num_hosts
    raise PlanError(
        f"Number of hosts ({num_hosts}) must be a multiple or a divisor of the number of data shards "
        f"({num_data_shards}): each host reads one data shard, or several consecutive ones. Use a number of "
        f"hosts that divides {num_data_shards} or is a multiple of it."
    )
