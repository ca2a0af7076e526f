"""Training runs next to their caches: build a ``RunPlan`` from cached tasks, store it, resolve its caches.

A run pins, for every task it reads, the exact bytes of one cache version: ``TaskCache.fingerprint``
is that version's manifest sha256 (what its ``COMPLETED`` marker holds), and ``shard_record_counts``
come from the manifest's split (which the plan names too). Runs are stored durably in the cache root::

    {root}/_runs/{name}.json      {"format": "taskdata.run/4", "plan": RunPlan.to_dict(), "served_before": N}

``served_before``: servers answer a step of the run only once it is below this number (they raise it, in the
record, before answering steps at or after it), and a new stage must start at or after it: so no stage ever
changes a step that a server may have answered. Records of format ``taskdata.run/3`` (no ``served_before``:
0), ``taskdata.run/2`` (no stages) and ``taskdata.run/1`` (the split beside the plan, not in it) are still
read, and mean what they meant.

Creating a run is idempotent (the same plan again is accepted), and a different plan under an existing
name is refused. A stored plan changes in one way only: ``add_stage`` appends a stage that starts at or
after the run's current step (which the caller states), at or after ``served_before`` and after its last
stage, so no step a trainer may have read changes. Every change is a compare-and-swap of the record
(``taskdata.cas``): two processes creating, appending or reserving at the same moment never lose a change
that one of them was told is stored. A store re-reads a run it remembers every ``refresh_seconds``, so a
long-running server sees stages that another process appended.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from taskdata import cas, fs
from taskdata.cache.format import (
    CacheFormatError,
    Manifest,
    completed_path,
    current_version,
    load_manifest,
    task_dir,
)
from taskdata.index import BatchSchedule, EpochOrder, PlanError, RunPlan, SkipRange, Stage, WindowedOrder
from taskdata.names import InvalidNameError, validate_name

if TYPE_CHECKING:  # annotations only: build_run imports the definitions when it runs, as before
    from taskdata.define.registry import Registry
    from taskdata.define.task import Task

__all__ = [
    "RUNS_DIR",
    "CacheUnavailableError",
    "RunChangedError",
    "RunConflictError",
    "RunError",
    "RunStore",
    "StoredRun",
    "build_run",
    "cache_fingerprint",
    "default_epoch_order",
]

RUNS_DIR = "_runs"
RUN_FORMAT = "taskdata.run/4"
# Runs without served_before (0).
_RUN_FORMAT_3 = "taskdata.run/3"
# Plans without stages.
_RUN_FORMAT_2 = "taskdata.run/2"
# The split was beside the plan, and not part of its fingerprint.
_RUN_FORMAT_1 = "taskdata.run/1"


class RunError(ValueError):
    """A run that cannot be built, stored or read as asked; the message names the fix."""


class RunConflictError(RunError):
    """A change the stored run refuses as it is now: a different plan under a name already taken, a stage
    in steps that servers may have answered."""


class RunChangedError(RunConflictError):
    """A change that was valid against the run as this store last saw it, refused because another writer
    changed the run first; the message names that writer's change."""


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
    # Servers answer only steps below this; a new stage starts at or after it (the module docstring).
    served_before: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.plan, RunPlan):
            raise RunError(f"A stored run needs a RunPlan but got {type(self.plan).__name__}.")
        if isinstance(self.served_before, bool) or not isinstance(self.served_before, int) or self.served_before < 0:
            raise RunError(f"A stored run's served_before must be an integer >= 0 but got {self.served_before!r}.")

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def split(self) -> str:
        return self.plan.split

    def to_dict(self) -> dict[str, Any]:
        return {"format": RUN_FORMAT, "plan": self.plan.to_dict(), "served_before": self.served_before}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_dict(cls, data: Any, where: str = "run") -> StoredRun:
        """A run record, or a bare ``RunPlan.to_dict()``; a plan without a split (written before plans
        held one) reads the split beside it in a ``taskdata.run/1`` record, else 'train', as it did then."""
        try:
            if isinstance(data, dict) and "format" in data:
                keys = {
                    RUN_FORMAT: {"format", "plan", "served_before"},
                    _RUN_FORMAT_3: {"format", "plan"},
                    _RUN_FORMAT_2: {"format", "plan"},
                    _RUN_FORMAT_1: {"format", "plan", "split"},
                }
                if keys.get(data["format"]) != set(data):
                    raise RunError(
                        f"{where}: a run record must be {{'format': {RUN_FORMAT!r}, 'plan': ..., 'served_before': "
                        f"...}} (or {{'format': {_RUN_FORMAT_3!r} or {_RUN_FORMAT_2!r}, 'plan': ...}}, or {{'format': {_RUN_FORMAT_1!r}, 'plan': ..., 'split': ...}}) but has "
                        f"format {data['format']!r} and keys {sorted(data)}."
                    )
                plan = data["plan"]
                if data["format"] not in (RUN_FORMAT, _RUN_FORMAT_3) and isinstance(plan, dict) and "stages" in plan:
                    raise RunError(f"{where}: a {data['format']!r} record's plan has no stages (format 3 added them).")
                if data["format"] == _RUN_FORMAT_1:
                    if not isinstance(plan, dict) or "split" in plan:
                        raise RunError(f"{where}: a {_RUN_FORMAT_1!r} record's plan has no split of its own.")
                    plan = {**plan, "split": data["split"]}
                return cls(RunPlan.from_dict(plan), data.get("served_before", 0))
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


def default_epoch_order(schedule: BatchSchedule, stages: Sequence[Stage] = ()) -> WindowedOrder:
    """The epoch order of new runs: windowed, blocks of ``DEFAULT_BLOCK_SIZE`` records dealt out over a batch
    as wide as the largest of the run's schedules, so that records read together never share a batch (why
    it is the default: the README, "Epoch orders"; plans that name no order stay per-record)."""
    schedules = [schedule] + [stage.schedule for stage in stages if stage.schedule is not None]
    return WindowedOrder(DEFAULT_BLOCK_SIZE, max(max(s.start, s.end) for s in schedules))


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
    """Runs stored as ``{root}/_runs/{name}.json``; a stored run only ever gains stages (``add_stage``) and a
    higher ``served_before`` (``reserve``), each change a compare-and-swap of its record (``taskdata.cas``).

    ``refresh_seconds``: how long a run read from its file is used before the file is read again (to see
    stages appended by another process; an unchanged file keeps the same ``StoredRun`` object). Past that,
    ``get`` still answers at once with the run it has and reads the file in a background thread (a read
    on an object store takes tens of milliseconds, which a server's event loop must not wait for); with
    0, every ``get`` reads the file. A run read earlier answers every step below its ``served_before``
    exactly as the run as stored now does (a later stage starts at or after it).
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
        # name -> the lock that lets one reservation per run and process at a time do I/O
        self._reserving: dict[str, threading.Lock] = {}

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
        data = cas.read(path).data
        return None if data is None else self._remember(name, data, read_at)

    def _remember(self, name: str, data: bytes, read_at: float) -> StoredRun:
        """The run of a record's bytes, remembered as ``name``'s unless the store has seen a later one since."""
        known = self._known.get(name)
        if known is not None and known[1] == data:
            run = known[0]
        else:
            run = self._parse(name, data)
        # A slow background read must not bring back an older record than one already seen.
        if known is None or known[1] == data or not _older(run, known[0]):
            self._known[name] = (run, data, read_at)
        return run

    def _parse(self, name: str, data: bytes) -> StoredRun:
        path = self.path(name)
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
        return run

    def names(self) -> list[str]:
        return sorted(n[: -len(".json")] for n in fs.listdir(self._dir) if _is_run_file(n))

    def create(self, run: StoredRun) -> bool:
        """Stores ``run``; True if written, False if the same run was already stored (perhaps with stages
        appended since). A different plan under the name is refused (``RunConflictError``), also when another
        process stored it a moment before: of writers racing to create one name, exactly one is told True."""

        def change(data: bytes | None) -> bytes | None:
            if data is None:
                return dataclasses.replace(run, served_before=0).to_bytes()
            existing = self._parse(run.name, data)
            if existing.plan.to_dict() != run.plan.to_dict() and not _created_as(existing, run):
                raise RunConflictError(
                    f"Run {run.name!r} already exists with a different plan (fingerprint "
                    f"{existing.plan.fingerprint()}, split {existing.split!r}; the new one has "
                    f"{run.plan.fingerprint()}, split {run.split!r}). A run's data never changes once "
                    "created: choose another name."
                )
            return None

        version, written = cas.update(self.path(run.name), change)
        assert version.data is not None
        self._remember(run.name, version.data, time.monotonic())
        return written

    def add_stage(self, name: str, stage: Stage, *, current_step: int) -> tuple[StoredRun, bool]:
        """Appends ``stage`` to run ``name``: (the run, True if written; False if it already ended with it).

        ``current_step``: a step no trainer of the run has read yet, its lookahead included (a trainer at step
        1,000 that fetches 16 steps ahead has read up to step 1,015: state 1,016 or more). The stage must start
        at or after it, at or after the run's ``served_before`` and after the run's last stage
        (``RunPlan.with_stage``). When another writer changed the run first, the stage is checked again
        against the run as that writer left it: appended on top if still valid, else refused with
        ``RunChangedError``, which names that writer's change. A stage invalid against the run as this store
        last saw it is a ``RunError``; one in steps servers may have answered, a ``RunConflictError``.
        """
        known = self._known.get(name)
        seen: list[StoredRun] = [] if known is None else [known[0]]
        last: list[bytes] = []

        def change(data: bytes | None) -> bytes | None:
            if data is None:
                raise RunError(
                    f"There is no stored run {name!r} under {self._dir} to add a stage to; runs: {self.names()}."
                )
            last[:] = [data]
            existing = self._parse(name, data)
            if not seen:
                seen.append(existing)  # what this writer read first: the run it meant to change
            if existing.plan.stages and existing.plan.stages[-1] == stage:
                return None  # a retried append
            return dataclasses.replace(existing, plan=_with_stage(existing, stage, current_step, seen[0])).to_bytes()

        try:
            version, written = cas.update(self.path(name), change)
        except RunError:
            if last:  # the refusal named the run as it is now: this store has seen it
                self._remember(name, last[0], time.monotonic())
            raise
        assert version.data is not None
        return self._remember(name, version.data, time.monotonic()), written

    def reserve(self, name: str, before: int) -> StoredRun:
        """Run ``name`` with ``served_before >= before``, raised in its record if lower: a server calls this
        before it answers any step at or after the ``served_before`` of the run it has.

        The run returned answers every step below ``before`` as the run ever will. Within a process, one
        reservation of a run at a time does I/O; the others find the run it stored.
        """
        with self._lock:
            lock = self._reserving.setdefault(name, threading.Lock())
        with lock:
            known = self._known.get(name)
            if known is not None and known[0].served_before >= before:
                return known[0]

            def change(data: bytes | None) -> bytes | None:
                if data is None:
                    raise RunError(f"There is no stored run {name!r} under {self._dir}; runs: {self.names()}.")
                existing = self._parse(name, data)
                if existing.served_before >= before:
                    return None
                return dataclasses.replace(existing, served_before=before).to_bytes()

            version, _ = cas.update(self.path(name), change)
            assert version.data is not None
            return self._remember(name, version.data, time.monotonic())


def _with_stage(existing: StoredRun, stage: Stage, current_step: int, seen: StoredRun) -> RunPlan:
    """``existing.plan`` with ``stage`` appended, or the error that says why not (``add_stage``)."""
    if stage.start < existing.served_before:
        raise RunConflictError(
            f"Run {existing.name!r} cannot take a stage at step {stage.start}: servers may have answered steps "
            f"up to {existing.served_before - 1} already (they reserve steps a little ahead of the trainers' "
            f"requests). The earliest step a new stage may start at is {existing.served_before}"
            + (f" (also at least the current step, {current_step})" if current_step > existing.served_before else "")
            + "."
        )
    try:
        return existing.plan.with_stage(stage, current_step=current_step)
    except PlanError as error:
        problem = str(error)
    if existing.plan.to_dict() != seen.plan.to_dict():
        try:
            seen.plan.with_stage(stage, current_step=current_step)
        except PlanError:
            pass  # refused by the run as this writer saw it too: the caller's own error
        else:
            appended = existing.plan.stages[len(seen.plan.stages):] if _is_prefix(seen.plan, existing.plan) else ()
            change = (f"appended stage(s) starting at step {', '.join(str(s.start) for s in appended)}" if appended
                      else "changed its plan")
            raise RunChangedError(
                f"Run {existing.name!r} changed while this stage was being added: another writer {change} (run "
                f"fingerprint now {existing.plan.fingerprint()}, was {seen.plan.fingerprint()}). {problem}"
            ) from None
    raise RunError(problem)


def _is_prefix(before: RunPlan, after: RunPlan) -> bool:
    """Whether ``after`` is ``before`` with stages appended."""
    kept = after.stages[: len(before.stages)]
    return dataclasses.replace(after, stages=kept).to_dict() == before.to_dict()


def _older(run: StoredRun, than: StoredRun) -> bool:
    """Whether ``run`` is an earlier state of the same run than ``than`` (fewer stages or a lower
    ``served_before``; a stored run only gains both)."""
    return len(run.plan.stages) < len(than.plan.stages) or run.served_before < than.served_before


def _created_as(existing: StoredRun, run: StoredRun) -> bool:
    """Whether ``existing`` is ``run`` with stages appended since it was created."""
    return len(existing.plan.stages) > len(run.plan.stages) and _is_prefix(run.plan, existing.plan)


def _is_run_file(file_name: str) -> bool:
    if not file_name.endswith(".json"):
        return False
    try:
        validate_name(file_name[: -len(".json")], kind="run")
    except InvalidNameError:
        return False  # temporary files of an interrupted write, or anything else that is not a run
    return True
