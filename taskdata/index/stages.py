"""Stages of a run: from a step on, other mixing rates and/or another batch schedule.

A plan's stage 0 starts at step 0 with the plan's own rates and batch schedule; every later ``Stage``
starts at a step and sets the rates, the batch schedule, or both (what it leaves out stays as it was:
a stage that sets only rates leaves a ramp running). Two pure mappings follow, each a short list of
segments with the one-stage closed form inside each segment:

- ``StagedSchedule``, step <-> stream position: segment ``j`` starts at step ``S_j`` and position
  ``Q_j`` with batch schedule ``B_j``, whose ramp counts steps from ``S_j``:
  ``P(s) = Q_j + B_j.first_position(s - S_j)``, and ``Q_{j+1} = P(S_{j+1})``.
- ``StagedMixing``, stream position <-> (task, task position): segment ``k`` starts at position ``R_k``
  (the first position of its stage's step) and interleaves the tasks whose rate is positive with a
  ``Mixing`` (exact, and its lag bounds hold within the stage). A task's stream continues across
  stages: at ``R_k`` task ``t`` has read ``base_k[t] = base_{k-1}[t] + c_{k-1}(R_k - R_{k-1})[t]``
  examples (``c`` is the previous segment's ``Mixing.counts``: a closed form of the earlier stages,
  computed once per plan), and the segment's own ``m``-th example of ``t`` is task position
  ``base_k[t] + m``. So changing rates never skips or repeats an example of a task's epoch, and epochs
  stay counted per task.

Appending a stage at step ``T`` changes nothing before ``T``: ``P(s)`` for ``s <= T`` depends only on
earlier segments, and the mixing of positions before ``P(T)`` only on earlier stages (prefix-stable).
A lookup bisects the segments (O(log stages)) and then does one stage's work (O(tasks) at most).
"""

from __future__ import annotations

import bisect
import dataclasses
import decimal
import functools
import itertools
import types
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, cast

import numpy as np

from taskdata.index.errors import PlanError
from taskdata.index.mixing import Mixing, check_position_range
from taskdata.index.schedule import BatchSchedule
from taskdata.rates import parse_rate

__all__ = ["STAGE_SYNTAX", "Stage", "StagedMixing", "StagedSchedule", "parse_stage"]

def _check_int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PlanError(f"{what} must be an integer >= {minimum} but got {value!r}.")
    return value


def _stage_rate(rate: Any, what: str) -> Fraction:
    """A rate >= 0: a stage may leave a task out with rate 0 (a plan's own rates are all positive)."""
    try:
        return parse_rate(rate, what)
    except ValueError:
        zero = (
            not isinstance(rate, bool)
            and isinstance(rate, int | float | Fraction | decimal.Decimal | str)
            and _is_zero(rate)
        )
        if zero:
            return Fraction(0)
        raise


def _is_zero(rate: Any) -> bool:
    try:
        return Fraction(str(rate) if isinstance(rate, float) else rate) == 0
    except (ValueError, ZeroDivisionError, TypeError):
        return False


@dataclasses.dataclass(frozen=True)
class Stage:
    """From step ``start`` on: mixing ``rates`` and/or the batch ``schedule`` (None keeps the previous one).

    ``rates`` name every task of the run, each with a rate >= 0 (0 leaves the task out of this stage),
    any scale; they are stored as shares that sum to 1 exactly. A ``schedule``'s ramp counts steps from
    ``start``. Checking the task names against the run is the plan's job.
    """

    start: int
    rates: Mapping[str, Fraction] | None = None
    schedule: BatchSchedule | None = None

    def __post_init__(self) -> None:
        _check_int(self.start, "A stage's start step", 1)
        if self.rates is None and self.schedule is None:
            raise PlanError(
                f"The stage at step {self.start} changes nothing: give it rates, a batch schedule, or both."
            )
        if self.schedule is not None and not isinstance(self.schedule, BatchSchedule):
            raise PlanError(
                f"The stage at step {self.start}: schedule must be a BatchSchedule but got "
                f"{type(self.schedule).__name__}: {self.schedule!r}."
            )
        if self.rates is not None:
            object.__setattr__(self, "rates", types.MappingProxyType(self._shares(self.rates)))

    def _shares(self, rates: Any) -> dict[str, Fraction]:
        if not isinstance(rates, Mapping) or not rates:
            raise PlanError(
                f"The stage at step {self.start}: rates must be a non-empty mapping of task -> rate but got "
                f"{rates!r}."
            )
        try:
            parsed = {
                task: _stage_rate(rates[task], f"The stage at step {self.start}: rate of task {task!r}")
                for task in sorted(rates)
            }
        except ValueError as error:
            raise PlanError(str(error)) from None
        total = sum(parsed.values())
        if total == 0:
            raise PlanError(
                f"The stage at step {self.start} gives every task rate 0; at least one task needs a positive rate."
            )
        return {task: rate / total for task, rate in parsed.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "rates": None if self.rates is None else {t: str(r) for t, r in self.rates.items()},
            "schedule": None if self.schedule is None else self.schedule.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Stage:
        if not isinstance(data, dict) or set(data) != {"start", "rates", "schedule"}:
            raise PlanError(
                f"A stage must be an object with exactly the keys 'start', 'rates' and 'schedule' but got {data!r}."
            )
        schedule = data["schedule"]
        return cls(
            start=data["start"],
            rates=data["rates"],
            schedule=None if schedule is None else BatchSchedule.from_dict(schedule),
        )


STAGE_SYNTAX = (
    "STEP:ITEM,ITEM,... where an ITEM is TASK=RATE (every task of the run, 0 leaves one out; any scale, "
    "e.g. 0.7 or 7/10), batch=SIZE (a constant global batch), or batch=START..END/STEPS (a ramp over STEPS "
    "steps from STEP on) with multiple-of=M (every ramp size a multiple of M)"
)


def parse_stage(text: str) -> Stage:
    """A ``Stage`` from its command-line form (``STAGE_SYNTAX``), e.g. ``200000:a=0.5,b=0.5`` or
    ``300000:batch=2048..4096/10000,multiple-of=256``."""
    if not isinstance(text, str):
        raise PlanError(f"A stage must be given as text ({STAGE_SYNTAX}) but got {text!r}.")
    step, colon, spec = text.partition(":")
    if not colon or not step.strip().isdigit() or not spec.strip():
        raise PlanError(f"Stage {text!r}: expected {STAGE_SYNTAX}.")
    rates: dict[str, str] = {}
    batch = multiple_of = None
    for item in spec.split(","):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not key or not value:
            raise PlanError(f"Stage {text!r}: {item!r} is not KEY=VALUE; expected {STAGE_SYNTAX}.")
        if key in rates or (key == "batch" and batch is not None) or (key == "multiple-of" and multiple_of is not None):
            raise PlanError(f"Stage {text!r} gives {key!r} twice.")
        if key == "batch":
            batch = value
        elif key == "multiple-of":
            multiple_of = _spec_int(text, key, value)
        else:
            rates[key] = value
    schedule = None
    if batch is not None:
        size, dots, ramp = batch.partition("..")
        if not dots:
            if multiple_of is not None:
                raise PlanError(f"Stage {text!r}: multiple-of applies to a ramp (batch=START..END/STEPS).")
            schedule = BatchSchedule.constant(_spec_int(text, "batch", size))
        else:
            end, slash, steps = ramp.partition("/")
            if not slash:
                raise PlanError(f"Stage {text!r}: a ramp is batch=START..END/STEPS, e.g. batch=2048..4096/10000.")
            schedule = BatchSchedule.ramp(
                _spec_int(text, "batch start", size),
                _spec_int(text, "batch end", end),
                _spec_int(text, "ramp steps", steps),
                multiple_of=1 if multiple_of is None else multiple_of,
            )
    elif multiple_of is not None:
        raise PlanError(f"Stage {text!r}: multiple-of applies to a ramp (batch=START..END/STEPS).")
    # Stage parses and normalises the rate strings itself (into Fractions), with its own messages.
    return Stage(int(step), cast("Mapping[str, Fraction]", rates) or None, schedule)


def _spec_int(text: str, what: str, value: str) -> int:
    if not value.strip().isdigit():
        raise PlanError(f"Stage {text!r}: {what} must be a whole number but got {value!r}.")
    return int(value)


@dataclasses.dataclass(frozen=True, eq=False)
class StagedSchedule:
    """Global batch size per step over segments of batch schedules: ``schedules[j]`` from step ``starts[j]``."""

    starts: tuple[int, ...]
    schedules: tuple[BatchSchedule, ...]
    _positions: tuple[int, ...] = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.starts or self.starts[0] != 0 or len(self.starts) != len(self.schedules):
            raise PlanError(
                f"A staged schedule needs one schedule per segment and a first segment at step 0 but got starts "
                f"{self.starts!r} for {len(self.schedules)} schedules."
            )
        if any(b <= a for a, b in itertools.pairwise(self.starts)):
            raise PlanError(f"Segment starts must increase strictly but are {list(self.starts)}.")
        positions = [0]
        for j in range(1, len(self.starts)):
            steps = self.starts[j] - self.starts[j - 1]
            positions.append(positions[-1] + self.schedules[j - 1].first_position(steps))
        object.__setattr__(self, "_positions", tuple(positions))

    @property
    def start_positions(self) -> tuple[int, ...]:
        """The first stream position of each segment."""
        return self._positions

    def segment_of_step(self, step: int) -> int:
        _check_int(step, "A step", 0)
        return bisect.bisect_right(self.starts, step) - 1

    def batch_size(self, step: int) -> int:
        j = self.segment_of_step(step)
        return self.schedules[j].batch_size(step - self.starts[j])

    def first_position(self, step: int) -> int:
        j = self.segment_of_step(step)
        return self._positions[j] + self.schedules[j].first_position(step - self.starts[j])

    def positions(self, step: int) -> range:
        j = self.segment_of_step(step)
        local = step - self.starts[j]
        first = self._positions[j] + self.schedules[j].first_position(local)
        return range(first, first + self.schedules[j].batch_size(local))

    def step_of(self, position: int) -> int:
        _check_int(position, "A stream position", 0)
        j = bisect.bisect_right(self._positions, position) - 1
        return self.starts[j] + self.schedules[j].step_of(position - self._positions[j])


@functools.lru_cache(maxsize=1024)
def _mixing(rates: tuple[Fraction, ...]) -> Mixing:
    # Building a Mixing searches trees (milliseconds for many tasks); stages often repeat rates.
    return Mixing.from_rates(rates)


@dataclasses.dataclass(frozen=True, eq=False)
class StagedMixing:
    """Stream position <-> (task, task position) over segments (see the module docstring).

    Segment ``k`` starts at stream position ``starts[k]`` and mixes the tasks ``tasks[k]`` (indices into
    the run's tasks, in the run's order) with the positive ``rates[k]`` (one per entry of ``tasks[k]``).
    """

    num_tasks: int
    starts: tuple[int, ...]
    tasks: tuple[tuple[int, ...], ...]
    rates: tuple[tuple[Fraction, ...], ...]
    mixings: tuple[Mixing, ...] = dataclasses.field(init=False, repr=False)
    # bases[k][t]: examples task t read before segment k.
    bases: tuple[tuple[int, ...], ...] = dataclasses.field(init=False, repr=False)
    _local: tuple[dict[int, int], ...] = dataclasses.field(init=False, repr=False)
    _task_arrays: tuple[np.ndarray | None, ...] = dataclasses.field(init=False, repr=False)
    _bases_by_task: tuple[tuple[int, ...], ...] = dataclasses.field(init=False, repr=False)

    @classmethod
    def of(cls, starts: Sequence[int], rates: Sequence[Sequence[Fraction]]) -> StagedMixing:
        """Segments from each stage's first position and its rates of every task (0 leaves one out)."""
        num_tasks = len(rates[0]) if rates else 0
        tasks, positive = [], []
        for stage_rates in rates:
            active = tuple(t for t, r in enumerate(stage_rates) if r > 0)
            tasks.append(active)
            positive.append(tuple(Fraction(stage_rates[t]) for t in active))
        return cls(num_tasks, tuple(starts), tuple(tasks), tuple(positive))

    def __post_init__(self) -> None:
        k = len(self.starts)
        if not k or self.starts[0] != 0 or len(self.tasks) != k or len(self.rates) != k:
            raise PlanError(
                f"A staged mixing needs segments from position 0 with tasks and rates for each but got starts "
                f"{self.starts!r}."
            )
        if any(b <= a for a, b in itertools.pairwise(self.starts)):
            raise PlanError(f"Segment start positions must increase strictly but are {list(self.starts)}.")
        mixings = tuple(_mixing(rates) for rates in self.rates)
        bases = [(0,) * self.num_tasks]
        for j in range(1, k):
            counts = mixings[j - 1].counts(self.starts[j] - self.starts[j - 1])
            base = list(bases[-1])
            for t, c in zip(self.tasks[j - 1], counts, strict=True):
                base[t] += c
            bases.append(tuple(base))
        every = tuple(range(self.num_tasks))
        object.__setattr__(self, "mixings", mixings)
        object.__setattr__(self, "bases", tuple(bases))
        object.__setattr__(self, "_local", tuple({t: i for i, t in enumerate(ts)} for ts in self.tasks))
        # None where a segment needs no mapping: all tasks in the run's order.
        object.__setattr__(
            self,
            "_task_arrays",
            tuple(None if ts == every else np.array(ts, np.int64) for ts in self.tasks),
        )
        object.__setattr__(self, "_bases_by_task", tuple(zip(*bases, strict=True)))

    def segment_of(self, position: int) -> int:
        """The segment that holds stream ``position`` (or, for a prefix length, that ends the prefix)."""
        return bisect.bisect_right(self.starts, position) - 1

    def locate(self, position: int) -> tuple[int, int]:
        """Stream position -> (task index, position in that task's stream)."""
        _check_int(position, "A stream position", 0)
        k = self.segment_of(position)
        local, m = self.mixings[k].locate(position - self.starts[k])
        task = self.tasks[k][local]
        return task, self.bases[k][task] + m

    def tasks_in_range(self, start: int, stop: int) -> np.ndarray:
        """The task of every position in ``[start, stop)``, as ``Mixing.tasks_in_range``."""
        parts = []
        for k, a, b in self._segments(start, stop):
            tasks = self.mixings[k].tasks_in_range(a, b)
            task_array = self._task_arrays[k]
            parts.append(tasks if task_array is None else task_array[tasks])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _segments(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """(segment, first, stop) of each segment that positions ``[start, stop)`` fall in, as positions of
        that segment's own mixing."""
        check_position_range(start, stop)
        first, last = self.segment_of(start), self.segment_of(max(start, stop - 1))
        return [
            (k, max(start, self.starts[k]) - self.starts[k], (stop if k == last else self.starts[k + 1]) - self.starts[k])
            for k in range(first, last + 1)
        ]

    def total(self, task: int) -> int | None:
        """How many examples ``task`` reads in the whole run: None if it is read for ever (its last
        stage gives it a positive rate)."""
        self._check_task(task)
        if task in self._local[-1]:
            return None
        return self.bases[-1][task]

    def position_of(self, task: int, task_position: int) -> int:
        """The inverse of ``locate``: the stream position of ``task``'s ``task_position``-th example."""
        self._check_task(task)
        _check_int(task_position, "A task position", 0)
        # The last segment that starts with at most task_position examples of the task read: a segment
        # that leaves the task out ends with as many as it started with, so it is never that segment
        # unless it is the last one, and then the example is never read.
        k = bisect.bisect_right(self._bases_by_task[task], task_position) - 1
        local = self._local[k].get(task)
        if local is None:
            raise PlanError(
                f"Example {task_position} of task {task}'s stream is never read: the run's last stage (from stream "
                f"position {self.starts[k]}) leaves the task out after it read {self.bases[k][task]} examples."
            )
        return self.starts[k] + self.mixings[k].position_of(local, task_position - self.bases[k][task])

    def counts(self, n: int) -> tuple[int, ...]:
        """How many of the first ``n`` positions each task owns."""
        _check_int(n, "A prefix length", 0)
        k = self.segment_of(n)
        out = list(self.bases[k])
        for t, c in zip(self.tasks[k], self.mixings[k].counts(n - self.starts[k]), strict=True):
            out[t] += c
        return tuple(out)

    def _check_task(self, task: int) -> None:
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < self.num_tasks:
            raise PlanError(f"Task index must be an integer in [0, {self.num_tasks}) but got {task!r}.")
