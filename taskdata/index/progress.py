"""Where a run stands before a step, per task, in closed form: examples taken, epochs, shares.

Before step ``S`` the run has covered stream positions ``[0, P(S))``; ``Mixing.counts`` gives each
task's part (``taken``), skip ranges give the part never delivered, and the stages' rates give the
part each task was meant to have (``target``: the sum over stages of rate times the positions in the
stage, exactly). The cost is O(stages x tasks + skip ranges x tasks), whatever ``S`` is.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from taskdata.index.errors import PlanError
from taskdata.index.plan import RunPlan

__all__ = ["RunProgress", "TaskProgress", "progress"]


@dataclasses.dataclass(frozen=True)
class TaskProgress:
    """One task before the step: ``taken`` examples of its stream (``skipped`` of them in skipped steps,
    never delivered), out of ``records`` per epoch; ``target`` is the exact number its rates call for."""

    task: str
    records: int
    taken: int
    skipped: int
    target: Fraction
    rate: Fraction  # the rate of the stage in force at the step

    @property
    def delivered(self) -> int:
        return self.taken - self.skipped

    @property
    def epoch(self) -> int:
        """The epoch the task's next example comes from (= epochs completed)."""
        return self.taken // self.records

    @property
    def repeated(self) -> int:
        """Examples taken that had been taken before (every example past the first epoch)."""
        return max(0, self.taken - self.records)


@dataclasses.dataclass(frozen=True)
class RunProgress:
    """The run before ``step``: ``positions`` examples covered, the stage in force at ``step``, per task."""

    step: int
    positions: int
    stage: int
    stage_start: int
    batch_size: int
    tasks: tuple[TaskProgress, ...]


def progress(plan: RunPlan, step: int) -> RunProgress:
    """``plan`` before ``step``: what steps ``0 .. step - 1`` covered."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise PlanError(f"A step must be an integer >= 0 but got {step!r}.")
    end = plan.first_position(step)
    mixing = plan.mixing
    taken = mixing.counts(end)
    skipped = [0] * len(taken)
    for skip in plan.skip:
        if skip.start >= step:
            break
        before = mixing.counts(plan.first_position(skip.start))
        after = mixing.counts(plan.first_position(min(skip.stop, step)))
        skipped = [s + b - a for s, a, b in zip(skipped, before, after, strict=True)]
    target = [Fraction(0)] * len(taken)
    for k, first in enumerate(mixing.starts):
        if first >= end:
            break
        last = mixing.starts[k + 1] if k + 1 < len(mixing.starts) else end
        length = min(last, end) - first
        for t, rate in zip(mixing.tasks[k], mixing.rates[k], strict=True):
            target[t] += rate * length
    rates = plan.rates_at(step)
    stage = plan.stage_at(step)
    return RunProgress(
        step=step,
        positions=end,
        stage=stage,
        stage_start=plan.stages[stage - 1].start if stage else 0,
        batch_size=plan.batch_size(step),
        tasks=tuple(
            TaskProgress(name, layout.num_records, taken[t], skipped[t], target[t], rates[name])
            for t, (name, layout) in enumerate(zip(plan.task_names, plan.layouts, strict=True))
        ),
    )
