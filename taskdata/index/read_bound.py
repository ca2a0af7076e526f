"""How many ranged reads a host may need at one step: the bound a plan states, in any epoch.

A host slice of ``S`` positions holds at most ``L_t = floor(S * r_t + 2 * lag_t)`` positions of task
``t`` (``Mixing.lag_bounds``: a task's count in any window is within twice its lag of ``S * r_t``),
and they are consecutive in that task's stream. The plan's epoch order bounds the reads ``L_t``
consecutive positions of a task can need (``EpochOrder.reads_bound``: every one under the per-record
order, a few per block under the block order). Reads of a task that happen to meet merge, so a step
needs at most the sum.

Every read fetches exactly its records: a host's bytes per step are those of its examples (at most
``S`` times the cache's largest record) under either order, which is what the client holds in memory
for a step.

The windowed order (``taskdata.index.orders.windowed``) takes one record of each of ``width`` blocks per
step, so its instructions may name a read per example (``reads_bound``). A client that knows
``read_horizon`` steps ahead reads each block once and keeps its rest (``EpochOrder.records_held``), so
it makes far fewer requests per step (``requests_bound``, summed from ``EpochOrder.requests_bound``).
"""

from __future__ import annotations

import math
from fractions import Fraction

from taskdata.index.errors import PlanError
from taskdata.index.plan import RunPlan

__all__ = ["reads_bound", "requests_bound", "task_positions_bound"]


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
    bounds = task_positions_bound(plan, slice_size)
    total = sum(plan.epoch_order.reads_bound(layout, n) for layout, n in zip(plan.layouts, bounds, strict=True))
    return min(total, slice_size)


def requests_bound(plan: RunPlan, slice_size: int) -> int:
    """At most this many requests per step serve ``slice_size`` consecutive positions of ``plan``'s stream for
    a client that knows ``plan.epoch_order.read_horizon`` steps ahead and keeps what it read (past its first
    step): ``reads_bound``, but for the windowed order the blocks its columns start (``EpochOrder.requests_bound``)."""
    bounds = task_positions_bound(plan, slice_size)
    total = sum(plan.epoch_order.requests_bound(layout, n) for layout, n in zip(plan.layouts, bounds, strict=True))
    return min(total, slice_size)


def _check_slice(slice_size: int) -> None:
    if isinstance(slice_size, bool) or not isinstance(slice_size, int) or slice_size < 1:
        raise PlanError(f"A host slice must be a positive number of positions but got {slice_size!r}.")
