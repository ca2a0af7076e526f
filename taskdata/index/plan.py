"""``RunPlan``: everything that decides which example a training run reads at every step.

A plan names the task or mixture, pins each task's cache version (fingerprint and per-shard record
counts) and the split it reads, the mixture rates, the seed, the batch-size schedule, the number of
data shards and the steps whose data is skipped. It is frozen, validates itself, round-trips through a JSON-able dict
(no pickle) and has a fingerprint.

Skipped steps (the t5x/seqio paper's "manually skipping batches that produce instabilities"): step
numbers keep counting and every step keeps its positions in the stream; a skipped step's data is
never delivered (its trainer is told to skip it) and the next step gets the data that follows. So
skipping never shifts any other step's batch, and un-skipping restores exactly the original data.

Stages (``taskdata.index.stages``): the plan's ``rates`` and ``schedule`` hold from step 0; each
``Stage`` sets other rates and/or another batch schedule from its start step on. Step <-> position
and position <-> task go through every stage (``positions``, ``batch_size``, ``step_of``, ``mixing``);
``schedule`` alone is only the schedule the run starts with. ``with_stage`` appends a stage, only at or
after the run's current step and after the last stage, and so never changes an earlier step's batch.

The fingerprint covers what decides the global batches (tasks, cache fingerprints and record
counts, the split, rates, seed, schedule, and the version of this index math), not the run's
name, its skipped steps nor its number of data shards: the global batch does not depend on how many hosts read it,
so a run resumed on 4 hosts instead of 8 keeps its fingerprint. A plan without stages has the
fingerprint it had before stages existed. Each stage chains onto the fingerprint of the plan before
it: ``fingerprint(stages 1..k) = sha256({"after": fingerprint(stages 1..k-1), "stage": stage k})``. So
``fingerprint_before(step)``, the fingerprint of the stages that decide the steps before ``step``,
does not change when a stage is appended at or after ``step``: that is what a checkpoint taken at
``step`` is checked against when it resumes.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import types
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from taskdata.fingerprint import fingerprint
from taskdata.index.errors import PlanError
from taskdata.index.layout import ShardLayout
from taskdata.index.orders import FEISTEL, EpochOrder, epoch_order_from_dict
from taskdata.index.schedule import BatchSchedule
from taskdata.index.stages import Stage, StagedMixing, StagedSchedule
from taskdata.index.tables import PlanTables
from taskdata.names import InvalidNameError, validate_name
from taskdata.rates import parse_rate
from taskdata.seeding import check_seed

__all__ = ["INDEX_MATH_VERSION", "RunPlan", "SkipRange", "TaskCache", "data_shard_for_host"]

# Part of every plan fingerprint: bump it when any mapping of this package changes, so that a
# checkpoint never resumes against different data under the same fingerprint.
INDEX_MATH_VERSION = 1

_PLAN_KEYS = (
    "name", "mixture", "caches", "rates", "seed", "schedule", "num_data_shards", "skip", "split", "stages",
)  # fmt: skip
# Keys a plan's JSON holds only when they differ from the default, so that plans made before they
# existed keep their exact JSON and fingerprint.
_OPTIONAL_PLAN_KEYS = ("epoch_order",)


@dataclasses.dataclass(frozen=True)
class TaskCache:
    """The cache version a run reads for one task: its fingerprint and its per-shard record counts."""

    fingerprint: str
    shard_record_counts: tuple[int, ...]

    def __post_init__(self) -> None:
        if (
            not isinstance(self.fingerprint, str)
            or not self.fingerprint
            or self.fingerprint != self.fingerprint.strip()
        ):
            raise PlanError(
                f"Cache fingerprint must be a non-empty string without surrounding spaces but got "
                f"{self.fingerprint!r}. Copy it from the cache version's manifest."
            )
        counts = self.shard_record_counts
        if isinstance(counts, list):
            counts = tuple(counts)
            object.__setattr__(self, "shard_record_counts", counts)
        ShardLayout(counts)  # validates the counts, naming the offending shard

    @property
    def num_records(self) -> int:
        return sum(self.shard_record_counts)

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "shard_record_counts": list(self.shard_record_counts)}


@dataclasses.dataclass(frozen=True)
class SkipRange:
    """Steps ``[start, stop)`` whose data is never delivered."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        for field in ("start", "stop"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PlanError(f"Skip range {field} must be an integer >= 0 but got {value!r}.")
        if self.stop <= self.start:
            raise PlanError(
                f"Skip range must have start < stop but got start={self.start}, stop={self.stop}. "
                f"To skip only step {self.start}, use stop={self.start + 1}."
            )


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A training run's data: see the module docstring.

    Attributes:
      name: the run's name (letters, digits, ``_``, ``.``, ``:``).
      mixture: the task or mixture the run trains on.
      caches: task name -> the cache version read for it.
      rates: task name -> mixing rate, any positive scale (stored normalised to sum to 1, exactly);
        ``None`` for a single-task run. Floats are read as the decimal they print as (0.1 is 1/10).
      seed: orders every epoch after the first.
      schedule: global batch size per step.
      num_data_shards: how many distinct slices each global batch is split into (hosts that hold
        parts of one model replica read the same slice: see ``data_shard_for_host``).
      skip: steps whose data is skipped (stored sorted, with overlapping ranges merged).
      split: the cache split every task is read from. One cache version (one cache fingerprint)
        holds every split, so the split is part of the plan and of its fingerprint: a validation
        run with the train run's record counts is another run.
      stages: later stages, by increasing start step: from its start on, each sets other rates
        (of every task; 0 leaves one out) and/or another batch schedule. ``rates`` and ``schedule``
        are those of stage 0, from step 0.
    """

    name: str
    mixture: str
    caches: Mapping[str, TaskCache]
    rates: Mapping[str, Fraction] | None
    seed: int
    schedule: BatchSchedule
    num_data_shards: int
    skip: tuple[SkipRange, ...] = ()
    split: str = "train"
    stages: tuple[Stage, ...] = ()
    epoch_order: EpochOrder = FEISTEL

    def __post_init__(self) -> None:
        _check_name(self.name, "run", "Run name")
        _check_name(self.mixture, "task or mixture", "Mixture")
        _check_name(self.split, "split", "Split")
        caches = _check_caches(self.caches)
        object.__setattr__(self, "caches", types.MappingProxyType(caches))
        object.__setattr__(self, "rates", types.MappingProxyType(_check_rates(self.rates, caches)))
        try:
            check_seed(self.seed)
        except ValueError:
            raise PlanError(
                f"Seed must be an integer in [0, 2**63) but got {self.seed!r}. Pick any fixed number, e.g. 0."
            ) from None
        if not isinstance(self.schedule, BatchSchedule):
            raise PlanError(
                f"Schedule must be a BatchSchedule but got {type(self.schedule).__name__}: {self.schedule!r}. "
                "Use BatchSchedule.constant(size) or BatchSchedule.ramp(start, end, steps)."
            )
        shards = self.num_data_shards
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise PlanError(f"Number of data shards must be a positive integer but got {shards!r}.")
        _check_schedule_splits(self.schedule, shards)
        object.__setattr__(self, "skip", _normalise_skips(self.skip))
        object.__setattr__(self, "stages", _check_stages(self.stages, caches, shards))
        if not isinstance(self.epoch_order, EpochOrder):
            raise PlanError(
                f"Epoch order must be an EpochOrder but got {type(self.epoch_order).__name__}: "
                f"{self.epoch_order!r}. Use FEISTEL (per record) or BlockOrder(block_size) (taskdata.index.orders)."
            )

    # Derived tables, built once per plan object; they are not fields, so they take no part in
    # equality or the fingerprint.
    @functools.cached_property
    def task_names(self) -> tuple[str, ...]:
        return tuple(self.caches)

    @functools.cached_property
    def mixing(self) -> StagedMixing:
        """Stream position <-> (task index, task position), through every stage."""
        assert self.rates is not None
        starts, rates = [0], [[self.rates[name] for name in self.task_names]]
        for stage in self.stages:
            if stage.rates is not None:
                starts.append(self.first_position(stage.start))
                rates.append([stage.rates[name] for name in self.task_names])
        return StagedMixing.of(starts, rates)

    @functools.cached_property
    def staged_schedule(self) -> StagedSchedule:
        """The global batch size of every step, through every stage (``positions`` etc. ask it)."""
        starts, schedules = [0], [self.schedule]
        for stage in self.stages:
            if stage.schedule is not None:
                starts.append(stage.start)
                schedules.append(stage.schedule)
        return StagedSchedule(tuple(starts), tuple(schedules))

    def positions(self, step: int) -> range:
        """The stream positions ``step`` covers: ``[P(step), P(step) + B(step))``."""
        return self.staged_schedule.positions(step)

    def batch_size(self, step: int) -> int:
        return self.staged_schedule.batch_size(step)

    def first_position(self, step: int) -> int:
        """P(step): the examples every step before ``step`` covers."""
        return self.staged_schedule.first_position(step)

    def step_of(self, position: int) -> int:
        """The step whose batch holds stream ``position``."""
        return self.staged_schedule.step_of(position)

    @functools.cached_property
    def _stage_starts(self) -> tuple[int, ...]:
        return tuple(stage.start for stage in self.stages)

    def stage_at(self, step: int) -> int:
        """The stage in force at ``step``: 0 for the plan's own rates and schedule, k for ``stages[k - 1]``."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise PlanError(f"A step must be an integer >= 0 but got {step!r}.")
        return bisect.bisect_right(self._stage_starts, step)

    def rates_at(self, step: int) -> Mapping[str, Fraction]:
        """The mixing rates in force at ``step`` (shares summing to 1; 0 for a task the stage leaves out)."""
        for stage in reversed(self.stages[: self.stage_at(step)]):
            if stage.rates is not None:
                return stage.rates
        assert self.rates is not None
        return self.rates

    def with_stage(self, stage: Stage, *, current_step: int) -> RunPlan:
        """This plan with ``stage`` appended: only at or after ``current_step`` (a step no trainer of the run
        has read yet, lookahead included) and after the last stage's start, so no read step changes."""
        if isinstance(current_step, bool) or not isinstance(current_step, int) or current_step < 0:
            raise PlanError(f"The run's current step must be an integer >= 0 but got {current_step!r}.")
        if not isinstance(stage, Stage):
            raise PlanError(f"A stage must be a Stage but got {type(stage).__name__}: {stage!r}.")
        last = self.stages[-1].start if self.stages else 0
        earliest = max(current_step, last + 1)
        if stage.start < earliest:
            why = (
                f"its current step is {current_step}: steps before it may have been read already"
                if current_step > last
                else f"its last stage starts at step {last}, and stages are appended in order"
            )
            raise PlanError(
                f"Run {self.name!r} cannot take a stage at step {stage.start}: {why}. The earliest step a new "
                f"stage may start at is {earliest}."
            )
        return dataclasses.replace(self, stages=(*self.stages, stage))

    @functools.cached_property
    def layouts(self) -> tuple[ShardLayout, ...]:
        return tuple(ShardLayout(self.caches[name].shard_record_counts) for name in self.task_names)

    @functools.cached_property
    def tables(self) -> PlanTables:
        """The layouts as numpy tables for the vectorised chain, built on first use (megabytes for
        65,536-shard caches, so not before) and dropped with this plan object."""
        return PlanTables.from_layouts(self.layouts)

    def task_index(self, task: str) -> int:
        try:
            return self.task_names.index(task)
        except ValueError:
            raise PlanError(
                f"Task {task!r} is not part of run {self.name!r}; its tasks are {list(self.task_names)}."
            ) from None

    @functools.cached_property
    def _skip_starts(self) -> tuple[int, ...]:
        return tuple(r.start for r in self.skip)

    def is_skipped(self, step: int) -> bool:
        return self.next_unskipped_step(step) != step

    def next_unskipped_step(self, step: int) -> int:
        """``step`` itself, or the first step after the skip range that holds it."""
        i = bisect.bisect_right(self._skip_starts, step) - 1
        return self.skip[i].stop if i >= 0 and step < self.skip[i].stop else step

    def step_after_batches(self, count: int) -> int:
        """The step after the ``count``-th batch delivered from step 0 (0 for none): ``count`` plus the skipped
        steps before it (a skipped step delivers no batch), for trainers that count only the batches they train."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise PlanError(f"A number of batches must be an integer >= 0 but got {count!r}.")
        step = count
        for skipped in self.skip:  # sorted and merged: each one starting before it pushes the step on
            if skipped.start >= step:
                break
            step += skipped.stop - skipped.start
        return step

    def fingerprint_description(self) -> dict[str, Any]:
        """What ``fingerprint`` hashes: without stages, the plan; with stages, the fingerprint of the plan
        without its last stage, and that stage."""
        if self.stages:
            return {"after": self._lineage[-2], "stage": self.stages[-1].to_dict()}
        return self._base_description()

    def _base_description(self) -> dict[str, Any]:
        data = self.to_dict()
        # Only what decides the data of every delivered step: not the name, not how many slices a batch
        # is cut into (resuming on 4 hosts instead of 8 keeps the fingerprint), and not the skip ranges
        # (skipping never moves the data of other steps, so an operator can add a skip range to a running
        # job's plan and resume its checkpoints, as the t5x/seqio paper describes for unstable batches).
        # The split stays: train and validation of one cache version share cache fingerprints.
        del data["name"], data["num_data_shards"], data["skip"]
        data.pop("stages", None)
        data["index_math"] = INDEX_MATH_VERSION
        return data

    def fingerprint(self) -> str:
        return self._lineage[-1]

    def fingerprint_before(self, step: int) -> str:
        """The fingerprint of what decides steps ``0 .. step - 1``: this plan without the stages that start
        at or after ``step``. Appending a stage at or after ``step`` leaves it unchanged."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise PlanError(f"A step must be an integer >= 0 but got {step!r}.")
        return self._lineage[bisect.bisect_left(self._stage_starts, step)]

    @functools.cached_property
    def _lineage(self) -> tuple[str, ...]:
        """The fingerprints of this plan with its first 0, 1, ... all stages."""
        chain = [fingerprint(self._base_description())]
        for stage in self.stages:
            chain.append(fingerprint({"after": chain[-1], "stage": stage.to_dict()}))
        return tuple(chain)

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description; ``RunPlan.from_dict`` rebuilds an equal plan from it."""
        assert self.rates is not None
        data: dict[str, Any] = {
            "name": self.name,
            "mixture": self.mixture,
            "caches": {name: cache.to_dict() for name, cache in self.caches.items()},
            "rates": {name: str(rate) for name, rate in self.rates.items()},
            "seed": self.seed,
            "schedule": self.schedule.to_dict(),
            "num_data_shards": self.num_data_shards,
            "skip": [[r.start, r.stop] for r in self.skip],
            "split": self.split,
            # Only when there are stages: a plan without them has the dict form (and the fingerprint) it
            # had before stages existed, which older readers still take.
            **({"stages": [stage.to_dict() for stage in self.stages]} if self.stages else {}),
        }
        if self.epoch_order != FEISTEL:
            data["epoch_order"] = self.epoch_order.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Any) -> RunPlan:
        if not isinstance(data, dict):
            raise PlanError(f"A run plan must be a JSON object but got {type(data).__name__}.")
        missing = [k for k in _PLAN_KEYS if k not in data and k != "stages"]
        unknown = sorted(set(data) - set(_PLAN_KEYS) - set(_OPTIONAL_PLAN_KEYS))
        if missing or unknown:
            raise PlanError(
                f"A run plan needs exactly the keys {list(_PLAN_KEYS)} ('stages' may be left out when there are "
                f"none; optionally {list(_OPTIONAL_PLAN_KEYS)}); missing {missing}, unknown {unknown}."
            )
        caches = data["caches"]
        if not isinstance(caches, dict):
            raise PlanError(f"Plan caches must be an object (task -> cache) but got {type(caches).__name__}.")
        parsed_caches = {}
        for task, cache in caches.items():
            if not isinstance(cache, dict) or set(cache) != {"fingerprint", "shard_record_counts"}:
                raise PlanError(
                    f"Cache of task {task!r} must be an object with keys 'fingerprint' and "
                    f"'shard_record_counts' but got {cache!r}."
                )
            parsed_caches[task] = TaskCache(cache["fingerprint"], tuple(cache["shard_record_counts"]))
        skip = data["skip"]
        if not isinstance(skip, list) or not all(isinstance(r, list) and len(r) == 2 for r in skip):
            raise PlanError(f"Plan skip must be a list of [start, stop] pairs but got {skip!r}.")
        stages = data.get("stages", [])
        if not isinstance(stages, list):
            raise PlanError(f"Plan stages must be a list of stages but got {type(stages).__name__}: {stages!r}.")
        return cls(
            name=data["name"],
            mixture=data["mixture"],
            caches=parsed_caches,
            rates=data["rates"],
            seed=data["seed"],
            schedule=BatchSchedule.from_dict(data["schedule"]),
            num_data_shards=data["num_data_shards"],
            skip=tuple(SkipRange(start, stop) for start, stop in skip),
            split=data["split"],
            stages=tuple(Stage.from_dict(stage) for stage in stages),
            epoch_order=epoch_order_from_dict(data["epoch_order"]) if "epoch_order" in data else FEISTEL,
        )


def data_shard_for_host(host: int, num_hosts: int, num_data_shards: int) -> int:
    """The data shard that ``host`` reads when consecutive hosts share one model replica (as in t5x).

    With model parallelism across hosts, each group of ``num_hosts / num_data_shards`` consecutive
    hosts holds one replica and reads one slice of the global batch. If your mesh groups hosts
    differently, use the host's position along the mesh's data axis instead.
    """
    for value, what in ((num_hosts, "Number of hosts"), (num_data_shards, "Number of data shards")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{what} must be a positive integer but got {value!r}.")
    if isinstance(host, bool) or not isinstance(host, int) or not 0 <= host < num_hosts:
        raise PlanError(f"Host must be an integer in [0, {num_hosts}) but got {host!r}.")
    if num_hosts % num_data_shards:
        raise PlanError(
            f"Number of hosts ({num_hosts}) must be a multiple of the number of data shards "
            f"({num_data_shards}): each data shard is read by the same number of hosts. Use a number of "
            f"data shards that divides {num_hosts}."
        )
    return host // (num_hosts // num_data_shards)


def _check_name(name: Any, kind: str, field: str) -> None:
    try:
        validate_name(name, kind=kind)
    except InvalidNameError as error:
        raise PlanError(f"{field}: {error}") from None


def _check_caches(caches: Any) -> dict[str, TaskCache]:
    if not isinstance(caches, Mapping) or not caches:
        raise PlanError(
            f"Caches must be a non-empty mapping of task name -> TaskCache but got {caches!r}. "
            "Every task the run reads needs its cache version."
        )
    checked = {}
    for task in sorted(caches):
        _check_name(task, "task", "Cache key")
        cache = caches[task]
        if not isinstance(cache, TaskCache):
            raise PlanError(
                f"Cache of task {task!r} must be a TaskCache but got {type(cache).__name__}: {cache!r}."
            )
        checked[task] = cache
    return checked


def _check_rates(rates: Any, caches: dict[str, TaskCache]) -> dict[str, Fraction]:
    if rates is None:
        if len(caches) != 1:
            raise PlanError(
                f"Rates are required for a run over {len(caches)} tasks ({sorted(caches)}); give each a rate, "
                "e.g. its number of examples."
            )
        return {next(iter(caches)): Fraction(1)}
    if not isinstance(rates, Mapping):
        raise PlanError(
            f"Rates must be a mapping of task name -> rate but got {type(rates).__name__}: {rates!r}."
        )
    if set(rates) != set(caches):
        raise PlanError(
            f"Rates and caches must name the same tasks: tasks without a rate {sorted(set(caches) - set(rates))}, "
            f"rates without a cache {sorted(set(rates) - set(caches))}. Give every task both."
        )
    try:
        parsed = {task: parse_rate(rates[task], f"Rate of task {task!r}") for task in caches}
    except ValueError as error:
        raise PlanError(str(error)) from None
    # The one place rates are normalised: every plan holds shares that sum to 1 exactly, whatever
    # scale its maker used (a mixture's own numbers, a stored plan's shares, a user's counts).
    total = sum(parsed.values())
    return {task: rate / total for task, rate in parsed.items()}


def _check_schedule_splits(schedule: BatchSchedule, num_data_shards: int) -> None:
    # A ramp's batch sizes are all multiples of multiple_of (start and end included), and some ramps
    # reach every such multiple between them, so multiple_of is what must split evenly.
    unit, what = (
        (schedule.start, "constant batch size")
        if schedule.is_constant
        else (schedule.multiple_of, "ramp's multiple_of")
    )
    if unit % num_data_shards:
        raise PlanError(
            f"Number of data shards ({num_data_shards}) must divide every global batch size, but it does not "
            f"divide the schedule's {what} ({unit}). Use a number of data shards that divides {unit}, or a "
            f"schedule whose {what} is a multiple of {num_data_shards}."
        )


def _check_stages(stages: Any, caches: dict[str, TaskCache], num_data_shards: int) -> tuple[Stage, ...]:
    if not isinstance(stages, tuple | list) or not all(isinstance(s, Stage) for s in stages):
        raise PlanError(f"Stages must be a tuple of Stage(start, rates, schedule) but got {stages!r}.")
    for before, after in itertools.pairwise(stages):
        if after.start <= before.start:
            raise PlanError(
                f"Stages must start at increasing steps but a stage at step {after.start} follows one at step "
                f"{before.start}. Order them by start step, one stage per step."
            )
    for stage in stages:
        if stage.rates is not None and set(stage.rates) != set(caches):
            raise PlanError(
                f"The stage at step {stage.start} must give a rate to every task of the run, and only to those: "
                f"without a rate {sorted(set(caches) - set(stage.rates))}, not in the run "
                f"{sorted(set(stage.rates) - set(caches))}. Give 0 to leave a task out of the stage."
            )
        if stage.schedule is not None:
            try:
                _check_schedule_splits(stage.schedule, num_data_shards)
            except PlanError as error:
                raise PlanError(f"The stage at step {stage.start}: {error}") from None
    return tuple(stages)


def _normalise_skips(skip: Any) -> tuple[SkipRange, ...]:
    if not isinstance(skip, tuple | list) or not all(isinstance(r, SkipRange) for r in skip):
        raise PlanError(f"Skip must be a tuple of SkipRange(start, stop) but got {skip!r}.")
    merged: list[SkipRange] = []
    for r in sorted(skip, key=lambda r: r.start):
        if merged and r.start <= merged[-1].stop:
            merged[-1] = SkipRange(merged[-1].start, max(merged[-1].stop, r.stop))
        else:
            merged.append(r)
    return tuple(merged)
