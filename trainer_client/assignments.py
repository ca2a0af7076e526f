"""Read instructions of one host at one step, and the interface of what supplies them.

Instructions are ``taskdata.index.StepReads``, the one value of a step's reads for a host slice: per
task, ranged reads of consecutive records as columns; ``order`` says, example by example, which task
the next example of the host's batch comes from (each task's examples are its reads' records, consumed
in order). Two sources supply them: ``ServerAssignments`` (``GET /shards``, decoded with
``taskdata.index.from_json``) and ``LocalAssignments`` (computed with ``taskdata.index.step_slices`` on
a local ``RunPlan``); both give equal values, so a host's batch never depends on which one it used.

A host reads one ``HostSlice`` of every global batch: slice ``index`` of ``count`` equal contiguous
slices. With one process per data-parallel group (the usual layout) that is (process index, process
count); ``trainer_client.arrays.host_slice`` derives it from the mesh.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from taskdata.index import RunPlan, StepReads, TaskReads

__all__ = [
    "AssignmentError",
    "AssignmentSource",
    "HostSlice",
    "RunInfo",
    "StepReads",
    "TaskReads",
]


class AssignmentError(RuntimeError):
    """Read instructions that cannot be obtained or do not hold together; the message names the fix."""


def _check_int(value: object, what: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AssignmentError(f"{what} must be an integer >= {minimum} but got {value!r}.")


@dataclasses.dataclass(frozen=True)
class HostSlice:
    """Slice ``index`` of ``count`` equal contiguous slices of every global batch."""

    index: int
    count: int

    def __post_init__(self) -> None:
        _check_int(self.count, "Host slice count", 1)
        _check_int(self.index, "Host slice index", 0)
        if self.index >= self.count:
            raise AssignmentError(
                f"Host slice index must be in [0, {self.count}) but got {self.index}. A host reads one of "
                f"the {self.count} slices of the global batch."
            )

    def rows(self, global_batch_size: int) -> range:
        """The rows of a global batch of ``global_batch_size`` this slice covers."""
        if global_batch_size % self.count:
            raise AssignmentError(
                f"A global batch of {global_batch_size} examples cannot be split into {self.count} equal host "
                f"slices. Use a batch size that is a multiple of {self.count}, or another number of hosts."
            )
        size = global_batch_size // self.count
        return range(self.index * size, (self.index + 1) * size)


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """The run a source serves: its plan (whose fingerprint a checkpoint must match) and split."""

    plan: RunPlan
    split: str

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def fingerprint(self) -> str:
        return self.plan.fingerprint()


class AssignmentSource(Protocol):
    """Supplies read instructions; ``fetch`` is called from one background thread at a time."""

    def run_info(self) -> RunInfo:
        """The run; called once, before any ``fetch``."""
        ...

    def fetch(self, first_step: int, num_steps: int, host_slice: HostSlice) -> list[StepReads]:
        """Instructions of ``host_slice`` for steps ``first_step .. first_step + num_steps - 1``, in order."""
        ...

    def close(self) -> None: ...
