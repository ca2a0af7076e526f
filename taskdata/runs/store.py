"""Training runs next to their caches: build a ``RunPlan`` from cached tasks, store it, resolve its caches.

A run pins, for every task it reads, the exact bytes of one cache version: ``TaskCache.fingerprint``
is that version's manifest sha256 (what its ``COMPLETED`` marker holds), and ``shard_record_counts``
come from the manifest's split (which the plan names too). Runs are stored durably in the cache root::

    {root}/_runs/{name}.json      {"format": "taskdata.run/3", "plan": RunPlan.to_dict()}

Format 3 plans may hold stages; records of format ``taskdata.run/2`` (no stages) and ``taskdata.run/1``
(the split beside the plan, not in it) are still read, and mean what they meant.

Creating a run is idempotent (the same plan again is accepted), and a different plan under an existing
name is refused. A stored plan changes in one way only: ``add_stage`` appends a stage that starts at or
after the run's current step (which the caller states) and after its last stage, so no step a trainer
may have read changes. A store re-reads a run it remembers every ``refresh_seconds``, so a long-running
server sees stages that another process appended.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from taskdata import fs
from taskdata.cache.format import (
    CacheFormatError,
    Manifest,
    completed_path,
    current_version,
    load_manifest,
    task_dir,
)
from taskdata.index import BatchSchedule, EpochOrder, PlanError, RunPlan, SkipRange, Stage
from taskdata.names import InvalidNameError, validate_name

if TYPE_CHECKING:  # annotations only: build_run imports the definitions when it runs, as before
    from taskdata.define.registry import Registry
    from taskdata.define.task import Task

__all__ = [
    "RUNS_DIR",
    "CacheUnavailableError",
    "RunConflictError",
    "RunError",
    "RunStore",
    "StoredRun",
    "build_run",
    "cache_fingerprint",
    "default_epoch_order",
]

RUNS_DIR = "_runs"
RUN_FORMAT = "taskdata.run/3"
# Plans without stages.
_RUN_FORMAT_2 = "taskdata.run/2"
# The split was beside the plan, and not part of its fingerprint.
_RUN_FORMAT_1 = "taskdata.run/1"


class RunError(ValueError):
    """A run that cannot be built, stored or read as asked; the message names the fix."""


class RunConflictError(RunError):
    """A different plan stored under a run name that is already taken."""


class CacheUnavailableError(ValueError):
    """A cache version a run needs that is missing, incomplete or fails verification."""

    def __init__(self, task: str, reason: str):
        self.task = task
        self.reason = reason
        super().__init__(f"Cache of task {task!r} is not available: {reason}")


@dataclasses.dataclass(frozen=True)
class StoredRun:
    """A run plan as stored: the plan pins cache versions and the split that picks their records."""

    plan: RunPlan

    def __post_init__(self) -> None:
        if not isinstance(self.plan, RunPlan):
            raise RunError(f"A stored run needs a RunPlan but got {type(self.plan).__name__}.")

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def split(self) -> str:
        return self.plan.split

    def to_dict(self) -> dict[str, Any]:
        return {"format": RUN_FORMAT, "plan": self.plan.to_dict()}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_dict(cls, data: Any, where: str = "run") -> StoredRun:
        """A run record, or a bare ``RunPlan.to_dict()``; a plan without a split (written before plans
        held one) reads the split beside it in a ``taskdata.run/1`` record, else 'train', as it did then."""
        try:
            if isinstance(data, dict) and "format" in data:
                keys = {
                    RUN_FORMAT: {"format", "plan"},
                    _RUN_FORMAT_2: {"format", "plan"},
                    _RUN_FORMAT_1: {"format", "plan", "split"},
                }
                if keys.get(data["format"]) != set(data):
                    raise RunError(
                        f"{where}: a run record must be {{'format': {RUN_FORMAT!r}, 'plan': ...}} (or of format "
                        f"{_RUN_FORMAT_2!r}, or {{'format': {_RUN_FORMAT_1!r}, 'plan': ..., 'split': ...}}) but has "
                        f"format {data['format']!r} and keys {sorted(data)}."
                    )
                plan = data["plan"]
                if data["format"] != RUN_FORMAT and isinstance(plan, dict) and "stages" in plan:
                    raise RunError(f"{where}: a {data['format']!r} record's plan has no stages (format 3 added them).")
                if data["format"] == _RUN_FORMAT_1:
                    if not isinstance(plan, dict) or "split" in plan:
                        raise RunError(f"{where}: a {_RUN_FORMAT_1!r} record's plan has no split of its own.")
                    plan = {**plan, "split": data["split"]}
                return cls(RunPlan.from_dict(plan))
            if isinstance(data, dict) and "split" not in data:
                data = {**data, "split": "train"}
            return cls(RunPlan.from_dict(data))
        except PlanError as error:
            raise RunError(f"{where}: {error}") from None


def cache_fingerprint(version_dir: str) -> str:
    """The manifest sha256 of a complete version (checked against its COMPLETED marker)."""
    load_manifest(version_dir)  # raises CacheFormatError unless COMPLETED matches the manifest
    return json.loads(fs.read_bytes(completed_path(version_dir)))["manifest_sha256"]


DEFAULT_BLOCK_SIZE = 64


def default_epoch_order(schedule: BatchSchedule, stages: Sequence[Stage] = ()) -> EpochOrder:
    """The epoch order of new runs: windowed, blocks of ``DEFAULT_BLOCK_SIZE`` records dealt out over a batch
    as wide as the largest of the run's schedules, so that records read together never share a batch (why
    it is the default: the README, "Epoch orders"; plans that name no order stay per-record)."""
    schedules = [schedule] + [stage.schedule for stage in stages if stage.schedule is not None]
    return EpochOrder.windowed(DEFAULT_BLOCK_SIZE, max(max(s.start, s.end) for s in schedules))


def build_run(
    registry: Registry,
    cache_root: str,
    *,
    name: str,
    mixture: str,
    seed: int,
    schedule: BatchSchedule,
    num_data_shards: int,
    skip: Sequence[SkipRange] = (),
    split: str = "train",
    stages: Sequence[Stage] = (),
    warn: Callable[[str], None] | None = None,
    epoch_order: EpochOrder | None = None,
) -> StoredRun:
    """A run over the CURRENT complete cache version of every task of ``mixture`` (a task or mixture).

    ``epoch_order`` defaults to ``default_epoch_order``: the windowed block order, blocks of 64 dealt out
    over a batch as wide as the run's largest. A CURRENT version built from another definition of its task
    than the registry's is refused (``CacheUnavailableError``); ``warn`` hears of a definition that cannot
    be checked here.
    """
    from taskdata.define.mixture import Mixture
    from taskdata.index import TaskCache

    item = registry.get(mixture)  # validates the name; unknown names list close matches
    if isinstance(item, Mixture):
        # The mixture's own exact numbers: the plan normalises them.
        rates: dict[str, Fraction] | None = dict(zip(item.task_names, item.rates, strict=True))
        tasks = list(item.task_names)
    else:
        rates, tasks = None, [item.name]
    caches = {}
    for task in tasks:
        root = task_dir(cache_root, task)
        try:
            version_dir = current_version(root)
            if version_dir is None:
                raise CacheFormatError(f"{root} has no CURRENT complete version")
            manifest = load_manifest(version_dir)
            fingerprint = json.loads(fs.read_bytes(completed_path(version_dir)))["manifest_sha256"]
        except (CacheFormatError, OSError) as error:
            raise CacheUnavailableError(
                task, f"{error}. Build it with 'taskdata cache --task {task} --output {cache_root}'."
            ) from None
        _check_built_from_current_definition(registry.get_task(task), version_dir, manifest, cache_root, warn)
        if split not in manifest.splits:
            raise RunError(
                f"Split {split!r} is not in the cache of task {task!r} ({version_dir}); it has "
                f"{sorted(manifest.splits)}. Pick one of those, or cache the split with '--split {split}'."
            )
        caches[task] = TaskCache(fingerprint, manifest.split(split).record_counts)
    try:
        plan = RunPlan(
            name=name,
            mixture=item.name,
            caches=caches,
            rates=rates,
            seed=seed,
            schedule=schedule,
            num_data_shards=num_data_shards,
            skip=tuple(skip),
            split=split,
            stages=tuple(stages),
            epoch_order=default_epoch_order(schedule, stages) if epoch_order is None else epoch_order,
        )
    except PlanError as error:
        raise RunError(str(error)) from None
    return StoredRun(plan)


def _check_built_from_current_definition(task: Task, version_dir: str, manifest: Manifest, cache_root: str,
                                         warn: Callable[[str], None] | None) -> None:
    """Refuses a CURRENT cache built from another definition of ``task`` (other source files, preprocessors,
    vocabulary): a run pinned to it would train on data the task no longer describes.

    Where the definition cannot be fingerprinted (its sources are not readable here, as on a server that
    only reads caches) nothing can be compared: ``warn`` is told so, and the version is pinned unchecked.
    """
    try:
        now = task.component_fingerprints()
    except Exception as error:  # a user's source may fail in any way when listing its files
        if warn is not None:
            warn(f"cannot check that the cache of task {task.name!r} ({version_dir}) was built from the task as "
                 f"defined here: fingerprinting the definition failed ({type(error).__name__}: {error}); it is "
                 "pinned unchecked")
        return
    if manifest.task_fingerprint == now["task"]:
        return
    differ = [part for part in sorted(now) if part != "task" and manifest.fingerprints.get(part) != now[part]]
    raise CacheUnavailableError(
        task.name,
        f"its CURRENT version {version_dir} was built from another definition of the task (task fingerprint "
        f"{manifest.task_fingerprint}; the task as defined now has {now['task']}; differing: "
        f"{', '.join(differ) or 'the whole definition'}). Plan with the definition the cache was built from "
        "(the same --c4-dir, --vocab and --module), or rebuild the cache for this one: "
        f"'taskdata cache --task {task.name} --output {cache_root}'.",
    )


class RunStore:
    """Runs stored as ``{root}/_runs/{name}.json``; a stored run only ever gains stages (``add_stage``).

    ``refresh_seconds``: how long a run read from its file is used before the file is read again (to see
    stages appended by another process; an unchanged file keeps the same ``StoredRun`` object). Past that,
    ``get`` still answers at once with the run it has and reads the file in a background thread (a read
    on an object store takes tens of milliseconds, which a server's event loop must not wait for); with
    0, every ``get`` reads the file.
    """

    def __init__(self, cache_root: str, *, refresh_seconds: float = 5.0):
        if isinstance(refresh_seconds, bool) or not isinstance(refresh_seconds, int | float) or refresh_seconds < 0:
            raise RunError(f"refresh_seconds must be a number >= 0 but got {refresh_seconds!r}.")
        self._dir = fs.join(cache_root, RUNS_DIR)
        self._refresh = float(refresh_seconds)
        self._lock = threading.Lock()
        # name -> (run, the file's bytes, when they were read: time.monotonic())
        self._known: dict[str, tuple[StoredRun, bytes, float]] = {}
        self._refreshing: set[str] = set()

    def path(self, name: str) -> str:
        try:
            return fs.join(self._dir, validate_name(name, kind="run") + ".json")
        except InvalidNameError as error:
            raise RunError(str(error)) from None

    def get(self, name: str) -> StoredRun | None:
        """The stored run, or None; read from its file again once ``refresh_seconds`` have passed."""
        known = self._known.get(name)
        if known is None or self._refresh == 0:
            return self._read(name)
        if time.monotonic() - known[2] >= self._refresh:
            self._read_in_background(name)
        return known[0]

    def _read_in_background(self, name: str) -> None:
        with self._lock:
            if name in self._refreshing:
                return
            self._refreshing.add(name)

        def read() -> None:
            try:
                self._read(name)
            except Exception:
                # A file that no longer reads as a run: the next get reads it in the open and raises.
                self._known.pop(name, None)
            finally:
                self._refreshing.discard(name)

        threading.Thread(target=read, name=f"read-run-{name}", daemon=True).start()

    def _read(self, name: str) -> StoredRun | None:
        path = self.path(name)
        read_at = time.monotonic()
        try:
            data = fs.read_bytes(path)
        except FileNotFoundError:
            return None
        known = self._known.get(name)
        if known is not None and known[1] == data:
            self._known[name] = (known[0], data, read_at)
            return known[0]
        try:
            record = json.loads(data)
        except ValueError as error:
            raise RunError(
                f"Stored run {path} is not valid JSON ({error}); restore it from a backup."
            ) from None
        run = StoredRun.from_dict(record, where=path)
        if run.name != name:
            raise RunError(
                f"Stored run {path} holds a plan named {run.name!r}; file and plan names must agree."
            )
        self._known[name] = (run, data, read_at)
        return run

    def names(self) -> list[str]:
        return sorted(n[: -len(".json")] for n in fs.listdir(self._dir) if _is_run_file(n))

    def create(self, run: StoredRun) -> bool:
        """Stores ``run``; True if written, False if the same run was already stored.

        Within one process creates are serialised; two processes racing to create different plans
        under one new name at the same moment are not (the object store has no create-if-absent here).
        """
        with self._lock:
            existing = self._read(run.name)
            if existing is not None:
                if existing.to_dict() != run.to_dict() and not _created_as(existing, run):
                    raise RunConflictError(
                        f"Run {run.name!r} already exists with a different plan (fingerprint "
                        f"{existing.plan.fingerprint()}, split {existing.split!r}; the new one has "
                        f"{run.plan.fingerprint()}, split {run.split!r}). A run's data never changes once "
                        "created: choose another name."
                    )
                return False
            self._write(run)
            return True

    def add_stage(self, name: str, stage: Stage, *, current_step: int) -> tuple[StoredRun, bool]:
        """Appends ``stage`` to run ``name``: (the run, True if written; False if it already ended with it).

        ``current_step``: a step no trainer of the run has read yet, its lookahead included (a trainer at step
        1,000 that fetches 16 steps ahead has read up to step 1,015: state 1,016 or more). The stage must start
        at or after it and after the run's last stage (``RunPlan.with_stage``). As with ``create``, two
        processes appending to one run at the same moment are not serialised.
        """
        with self._lock:
            existing = self._read(name)
            if existing is None:
                raise RunError(
                    f"There is no stored run {name!r} under {self._dir} to add a stage to; runs: {self.names()}."
                )
            if existing.plan.stages and existing.plan.stages[-1] == stage:
                return existing, False  # a retried append
            try:
                run = StoredRun(existing.plan.with_stage(stage, current_step=current_step))
            except PlanError as error:
                raise RunError(str(error)) from None
            self._write(run)
            return run, True

    def _write(self, run: StoredRun) -> None:
        data = run.to_bytes()
        fs.write_atomic(self.path(run.name), data)
        self._known[run.name] = (run, data, time.monotonic())


def _created_as(existing: StoredRun, run: StoredRun) -> bool:
    """Whether ``existing`` is ``run`` with stages appended since it was created."""
    kept = run.plan.stages
    if len(existing.plan.stages) <= len(kept):
        return False
    return dataclasses.replace(existing.plan, stages=existing.plan.stages[: len(kept)]).to_dict() == run.plan.to_dict()


def _is_run_file(file_name: str) -> bool:
    if not file_name.endswith(".json"):
        return False
    try:
        validate_name(file_name[: -len(".json")], kind="run")
    except InvalidNameError:
        return False  # temporary files of an interrupted write, or anything else that is not a run
    return True
