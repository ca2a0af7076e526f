"""How many ranged reads a host may need at one step: the bound a plan states, in any epoch.

A host slice of ``S`` positions holds at most ``L_t = floor(S * r_t + 2 * lag_t)`` positions of task
``t`` (``Mixing.lag_bounds``: a task's count in any window is within twice its lag of ``S * r_t``),
and they are consecutive in that task's stream. Under the per-record order every one may be its own
read. Under the block order a range of ``L`` consecutive positions that crosses ``E`` epoch ends
touches at most ``ceil(L / K) + 2E + 1`` blocks of ``K`` records (each epoch's part adds at most one
block to ``ceil(part / K)``, and the parts' ceilings add at most ``E``), with ``E <= ceil((L - 1) /
n_t)``; and a block (``K`` records contiguous in the cache's order, read cyclically) is at most ``c_t``
reads, one more per cache-shard boundary inside it (``runs_per_block``). Epoch 0's stored order obeys
the same count. Reads of a task that happen to meet merge, so a step needs at most the sum.

Every read fetches exactly its records: a host's bytes per step are those of its examples (at most
``S`` times the cache's largest record) under either order, which is what the client holds in memory
for a step.

The windowed order (``taskdata.index.windowed_order``) takes one record of each of ``width`` blocks per
step, so its instructions may name a read per example (``reads_bound``). A client that knows
``read_horizon`` steps ahead reads each block once and keeps its rest (``EpochOrder.records_held``): at
each row of its table one column in ``K`` starts a block and one in ``K`` wraps to the start of its
stretch, so ``L`` consecutive positions of one row start at most ``2 * (ceil(L / K) + 1)`` blocks, each
at most ``c_t`` requests (``requests_bound``), when the task's examples per step are the order's
``width``; a client's first step starts every column.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from taskdata.index.errors import PlanError
from taskdata.index.layout import ShardLayout
from taskdata.index.plan import RunPlan

__all__ = ["reads_bound", "requests_bound", "runs_per_block", "task_positions_bound"]


def runs_per_block(layout: ShardLayout, block_size: int) -> int:
    """The most ranged reads ``block_size`` consecutive records of ``layout``'s order (wrapping from
    the last record to the first) can need: one, plus the shard boundaries inside them."""
    n = layout.num_records
    length = min(block_size, n)
    counts = np.array(layout.record_counts, np.int64)
    # Where a read must break: every non-empty shard's first record, and record 0 (the wrap).
    starts = np.unique((np.cumsum(counts) - counts)[counts > 0] % n)
    if length <= 1:
        return 1
    # The window with the most breaks inside starts just before one of them: count the breaks in
    # [b, b + length - 2] for each break b, cyclically.
    doubled = np.concatenate((starts, starts + n))
    inside = np.searchsorted(doubled, starts + length - 1, side="left") - np.arange(len(starts))
    return 1 + int(inside.max())


def task_positions_bound(plan: RunPlan, slice_size: int) -> tuple[int, ...]:
    """Per task of ``plan``: the most of its positions any ``slice_size`` consecutive positions hold.

    Within one mixing segment (stage), a window of L positions holds at most ``L * rate + 2 * lag`` of a
    task's. A window across segments is split among them, so it holds at most ``slice_size`` times the
    task's largest rate plus twice the sum of its lags over every segment: loose with many stages, but
    an upper bound always (and exact to the formula above for a plan of one segment).
    """
    _check_slice(slice_size)
    staged = plan.mixing
    largest_rate = [Fraction(0)] * staged.num_tasks
    lags = [Fraction(0)] * staged.num_tasks
    for tasks, rates, mixing in zip(staged.tasks, staged.rates, staged.mixings, strict=True):
        for t, rate, lag in zip(tasks, rates, mixing.lag_bounds(), strict=True):
            largest_rate[t] = max(largest_rate[t], rate)
            lags[t] += lag
    return tuple(
        min(slice_size, math.floor(slice_size * rate + 2 * lag)) for rate, lag in zip(largest_rate, lags, strict=True)
    )


def reads_bound(plan: RunPlan, slice_size: int) -> int:
    """At most this many reads serve any ``slice_size`` consecutive positions of ``plan``'s stream, in
    any epoch (a host slice at any step; skipped steps read nothing)."""
    total = 0
    block_size = plan.epoch_order.block_size
    for layout, positions in zip(plan.layouts, task_positions_bound(plan, slice_size), strict=True):
        if block_size is None or positions == 0 or plan.epoch_order.kind == "windowed":
            total += positions
            continue
        epoch_ends = -(-(positions - 1) // layout.num_records)
        blocks = -(-positions // block_size) + 2 * epoch_ends + 1
        total += min(positions, runs_per_block(layout, block_size) * blocks)
    return min(total, slice_size)


def requests_bound(plan: RunPlan, slice_size: int) -> int:
    """At most this many requests per step serve ``slice_size`` consecutive positions of ``plan``'s stream for
    a client that knows ``plan.epoch_order.read_horizon`` steps ahead and keeps what it read (past its first
    step): ``reads_bound``, but for the windowed order the blocks its columns start (module docstring)."""
    order = plan.epoch_order
    if order.kind != "windowed":
        return reads_bound(plan, slice_size)
    assert order.block_size is not None
    total = 0
    for layout, positions in zip(plan.layouts, task_positions_bound(plan, slice_size), strict=True):
        if positions:
            blocks = 2 * (-(-positions // order.block_size) + 1)
            total += min(positions, runs_per_block(layout, order.block_size) * blocks)
    return min(total, slice_size)


def _check_slice(slice_size: int) -> None:
    if isinstance(slice_size, bool) or not isinstance(slice_size, int) or slice_size < 1:
        raise PlanError(f"A host slice must be a positive number of positions but got {slice_size!r}.")
