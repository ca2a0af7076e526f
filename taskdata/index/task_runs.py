"""A step's read runs task by task: the chain of ``arrays.example_arrays`` and ``ExampleArrays.grouped_runs``
in fewer, larger numpy steps, for host slices of a contiguous range of positions (``host_reads``).

Within a contiguous range of stream positions, each task's examples are consecutive positions of its
own stream: ``[a_t, a_t + n_t)``, ``a_t`` the task's examples before the range (``counts``). So this
works task by task, in task order, rather than position by position:

- mixing gives only which task each position holds (the answer's ``order``, and ``n_t`` per slice);
- a task's positions are cut into the epochs they fall in, in Python (a few per task and step); each
  epoch's record indices are one ``arange``, and every epoch past 0 of every task goes through one
  ``permute_blocks`` (or ``block_permute_many``) call;
- shard and record as in ``example_arrays``; then the read runs of every (task, slice), which are
  consecutive here: no sort.

Runs come grouped task-major: group ``t * parts + p`` holds task ``t``'s runs of slice ``p`` (each slice's
runs of a task are ``cut(slice).runs(task)`` of ``ExampleArrays``; tests compare them).
"""

from __future__ import annotations

import numpy as np

from taskdata.index.block_order import block_permute_many
from taskdata.index.epoch_order import block_permutation, windowed_permutation
from taskdata.index.permutation import _epoch_permutation, permute_blocks
from taskdata.index.plan import RunPlan
from taskdata.index.windowed_order import windowed_permute_many

__all__ = ["task_runs"]


def task_runs(
    plan: RunPlan, positions: range, parts: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(bounds, shards, first_records, counts, tasks)`` of ``positions`` cut into ``parts`` equal slices.

    The runs of group ``g = t * parts + p`` (task ``t``, slice ``p``) are entries ``bounds[g]`` to
    ``bounds[g + 1]`` of ``shards``, ``first_records`` and ``counts``; ``tasks`` holds the task index of
    every position, in order. ``positions`` must fit int64 (``arrays.fits_int64``) and split evenly.
    """
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
    indices = _record_indices(plan, plan.mixing.counts(start), per_task, size)
    tables = plan.tables
    task_of = np.arange(num_tasks, dtype=np.int64).repeat(per_task)
    indices += tables.record_base[task_of]
    global_shards = tables.shard_finder.find(indices, task_of)
    indices -= tables.shard_starts[global_shards]  # records within their shards now
    global_shards -= tables.shard_base[task_of]
    records, shards = indices, global_shards
    # A run starts at every group's first example, and wherever the record is not the next of the same shard.
    group_starts = np.zeros(len(per_group) + 1, np.int64)
    per_group.cumsum(out=group_starts[1:])
    new_run = np.empty(size + 1, bool)
    np.not_equal(records[1:], records[:-1] + 1, out=new_run[1:size])
    new_run[1:size] |= shards[1:] != shards[:-1]
    new_run[group_starts] = True
    # (Array methods rather than np.flatnonzero, np.diff...: their Python wrappers cost as much as the work.)
    starts = new_run.nonzero()[0]
    counts = starts[1:] - starts[:-1]
    starts = starts[:-1]
    bounds = starts.searchsorted(group_starts)
    return bounds, shards[starts], records[starts], counts, tasks


def _record_indices(plan: RunPlan, before: tuple[int, ...], per_task: list[int], size: int) -> np.ndarray:
    """Record index in its task's cache order of every example, task by task: task ``t``'s ``per_task[t]``
    examples from its stream position ``before[t]`` on, each epoch past 0 permuted (``epoch_order``)."""
    lengths: list[int] = []
    shifts: list[int] = []  # per block: its first record index minus its first entry's place
    permuted: list[tuple[int, int, int]] = []  # (block, task, epoch) of the blocks past epoch 0
    done = 0
    records_per_task = plan.tables.num_records.tolist()
    for task, (first, count, num_records) in enumerate(zip(before, per_task, records_per_task, strict=True)):
        epoch, offset = divmod(first, num_records)
        while count:
            length = min(count, num_records - offset)
            if epoch:
                permuted.append((len(lengths), task, epoch))
            lengths.append(length)
            shifts.append(offset - done)
            done += length
            count -= length
            epoch, offset = epoch + 1, 0
    indices = np.arange(size, dtype=np.int64)
    if len(lengths) == 1:
        indices += shifts[0]
    else:
        indices += np.array(shifts, np.int64).repeat(lengths)
    if not permuted:
        return indices
    names, layouts, block_size = plan.task_names, plan.layouts, plan.epoch_order.block_size
    blocks = [block for block, _, _ in permuted]
    if len(permuted) == len(lengths):
        where = None
        block_lengths = lengths
    else:
        mine = np.zeros(len(lengths), bool)
        mine[blocks] = True
        where = mine.repeat(lengths).nonzero()[0]
        block_lengths = [lengths[block] for block in blocks]
    offsets = indices if where is None else indices[where]
    order = plan.epoch_order
    if order.kind == "windowed":
        assert block_size is not None and order.width is not None
        windows = [
            windowed_permutation(plan.seed, names[t], epoch, layouts[t].num_records, block_size, order.width)
            for _, t, epoch in permuted
        ]
        which = np.arange(len(blocks), dtype=np.int64).repeat(block_lengths)
        permuted_indices = windowed_permute_many(windows, which, offsets)
    elif block_size is None:
        orders = [
            _epoch_permutation(plan.seed, names[t], epoch, layouts[t].num_records) for _, t, epoch in permuted
        ]
        permuted_indices = permute_blocks(orders, block_lengths, offsets)
    else:
        block_orders = [
            block_permutation(plan.seed, names[t], epoch, layouts[t].num_records, block_size)
            for _, t, epoch in permuted
        ]
        which = np.arange(len(blocks), dtype=np.int64).repeat(block_lengths)
        permuted_indices = block_permute_many(block_orders, which, offsets)
    if where is None:
        return permuted_indices
    indices[where] = permuted_indices
    return indices
