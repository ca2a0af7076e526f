"""Where a run reads one record: every step at which it comes up, by inverting the index math.

A task's stream holds each of its records exactly once per epoch, so the ``j``-th time a record comes
up is in the task's epoch ``j``, at task position ``j * n + offset_j`` (``offset_j`` is where epoch
``j``'s order puts the record: the permutation's inverse). The mixing's inverse gives the stream
position and the schedule's inverse the step. How many times it came up before a step is closed form
too: the task's examples before that step (``counts``) are some whole epochs and a part of the next
one, which holds the record or not. Nothing scans steps: listing ``k`` reads costs ``O(k)`` lookups,
whatever the step.
"""

from __future__ import annotations

import dataclasses

from taskdata.index.errors import PlanError
from taskdata.index.plan import RunPlan

__all__ = ["Occurrence", "occurrences", "reads_before"]


@dataclasses.dataclass(frozen=True)
class Occurrence:
    """One read of a record: in ``epoch`` of its task, at stream ``position`` of ``step``, by ``data_shard``.

    ``skipped``: the plan skips the step, so the record is never delivered there.
    """

    epoch: int
    step: int
    position: int
    data_shard: int
    skipped: bool

    def to_dict(self) -> dict[str, int | bool]:
        return dataclasses.asdict(self)


def _task_and_size(plan: RunPlan, task: str, index: int) -> tuple[int, int]:
    t = plan.task_index(task)
    n = plan.layouts[t].num_records
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
        raise PlanError(f"Record index of task {task!r} must be an integer in [0, {n}) but got {index!r}.")
    return t, n


def reads_before(plan: RunPlan, task: str, index: int, step: int) -> int:
    """How many times the run reads record ``index`` (in ``task``'s cache order) in steps ``0 .. step - 1``.

    Skipped steps count: their positions hold the record even though it is not delivered.
    """
    t, n = _task_and_size(plan, task, index)
    taken = plan.mixing.counts(plan.first_position(step))[t]
    epochs, rest = divmod(taken, n)
    if rest == 0:
        return epochs
    offset = plan.epoch_order.task_position(plan.seed, task, n, epochs, index) - epochs * n
    return epochs + (offset < rest)


def occurrences(
    plan: RunPlan, task: str, index: int, *, from_step: int = 0, until_step: int | None = None, limit: int = 100
) -> tuple[Occurrence, ...]:
    """The first ``limit`` reads of record ``index`` of ``task`` at steps ``from_step`` up to ``until_step``
    (exclusive; None: no end), in order. Fewer when the run's last stage leaves the task out."""
    t, n = _task_and_size(plan, task, index)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise PlanError(f"limit must be an integer >= 0 but got {limit!r}.")
    if until_step is not None and until_step < from_step:
        raise PlanError(f"until_step ({until_step}) must not be before from_step ({from_step}).")
    end = None if until_step is None else plan.first_position(until_step)
    total = plan.mixing.total(t)
    out: list[Occurrence] = []
    epoch = reads_before(plan, task, index, from_step)
    while len(out) < limit:
        task_position = plan.epoch_order.task_position(plan.seed, task, n, epoch, index)
        if total is not None and task_position >= total:
            break
        position = plan.mixing.position_of(t, task_position)
        if end is not None and position >= end:
            break
        step = plan.step_of(position)
        positions = plan.positions(step)
        data_shard = (position - positions.start) // (len(positions) // plan.num_data_shards)
        out.append(Occurrence(epoch, step, position, data_shard, plan.is_skipped(step)))
        epoch += 1
    return tuple(out)
