"""Training runs next to their caches: build a ``RunPlan`` from cached tasks, store it, resolve its caches.

A run pins, for every task it reads, the exact bytes of one cache version: ``TaskCache.fingerprint``
is that version's manifest sha256 (what its ``COMPLETED`` marker holds), and ``shard_record_counts``
come from the manifest's split. Runs are stored durably in the cache root::

    {root}/_runs/{name}.json      {"format": "taskdata.run/1", "plan": RunPlan.to_dict(), "split": "train"}

Creating a run is idempotent (the same plan again is accepted), and a different plan under an existing
name is refused: a run's data never changes once trainers may have read it.

``CacheResolver`` turns (task, cache fingerprint, split) back into the version folder whose manifest
hash matches (whatever ``CURRENT`` says now: a rebuild never moves a running job to other data). It
verifies that version's split once, on first use, and keeps its manifest and every shard's record
offsets in memory (8 bytes per record); a verification failure is remembered too.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from taskdata import fs
from taskdata.cache_format import (
    CacheFormatError,
    Manifest,
    completed_path,
    current_version,
    find_version,
    list_versions,
    load_manifest,
    task_dir,
)
from taskdata.index import BatchSchedule, PlanError, RunPlan, SkipRange
from taskdata.names import InvalidNameError, validate_name

__all__ = [
    "RUNS_DIR",
    "CacheResolver",
    "CacheUnavailableError",
    "ResolvedCache",
    "RunConflictError",
    "RunError",
    "RunStore",
    "StoredRun",
    "build_run",
    "cache_fingerprint",
]

RUNS_DIR = "_runs"
RUN_FORMAT = "taskdata.run/1"


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
    """A run plan and the cache split it reads (the plan pins versions; the split picks their records)."""

    plan: RunPlan
    split: str = "train"

    def __post_init__(self) -> None:
        if not isinstance(self.plan, RunPlan):
            raise RunError(f"A stored run needs a RunPlan but got {type(self.plan).__name__}.")
        try:
            validate_name(self.split, kind="split")
        except InvalidNameError as error:
            raise RunError(str(error)) from None

    @property
    def name(self) -> str:
        return self.plan.name

    def to_dict(self) -> dict[str, Any]:
        return {"format": RUN_FORMAT, "plan": self.plan.to_dict(), "split": self.split}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_dict(cls, data: Any, where: str = "run") -> StoredRun:
        """A run record, or a bare ``RunPlan.to_dict()`` (which reads split 'train')."""
        try:
            if isinstance(data, dict) and "format" in data:
                if data["format"] != RUN_FORMAT or set(data) != {"format", "plan", "split"}:
                    raise RunError(
                        f"{where}: a run record must be {{'format': {RUN_FORMAT!r}, 'plan': ..., 'split': ...}} "
                        f"but has format {data['format']!r} and keys {sorted(data)}."
                    )
                return cls(RunPlan.from_dict(data["plan"]), data["split"])
            return cls(RunPlan.from_dict(data))
        except PlanError as error:
            raise RunError(f"{where}: {error}") from None


def cache_fingerprint(version_dir: str) -> str:
    """The manifest sha256 of a complete version (checked against its COMPLETED marker)."""
    load_manifest(version_dir)  # raises CacheFormatError unless COMPLETED matches the manifest
    return json.loads(fs.read_bytes(completed_path(version_dir)))["manifest_sha256"]


def build_run(
    registry: Any,
    cache_root: str,
    *,
    name: str,
    mixture: str,
    seed: int,
    schedule: BatchSchedule,
    num_data_shards: int,
    skip: Sequence[SkipRange] = (),
    split: str = "train",
) -> StoredRun:
    """A run over the CURRENT complete cache version of every task of ``mixture`` (a task or mixture)."""
    from taskdata.index import TaskCache
    from taskdata.mixture import Mixture

    item = registry.get(mixture)  # validates the name; unknown names list close matches
    if isinstance(item, Mixture):
        rates: dict[str, float] | None = dict(zip(item.task_names, item.rates, strict=True))
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
        )
    except PlanError as error:
        raise RunError(str(error)) from None
    return StoredRun(plan, split)


class RunStore:
    """Runs stored as ``{root}/_runs/{name}.json``; a stored run never changes."""

    def __init__(self, cache_root: str):
        self._dir = fs.join(cache_root, RUNS_DIR)
        self._lock = threading.Lock()
        self._known: dict[str, StoredRun] = {}

    def path(self, name: str) -> str:
        try:
            return fs.join(self._dir, validate_name(name, kind="run") + ".json")
        except InvalidNameError as error:
            raise RunError(str(error)) from None

    def get(self, name: str) -> StoredRun | None:
        """The stored run, or None. Found runs are remembered: they are immutable."""
        known = self._known.get(name)
        if known is not None:
            return known
        path = self.path(name)
        try:
            data = json.loads(fs.read_bytes(path))
        except FileNotFoundError:
            return None
        except ValueError as error:
            raise RunError(
                f"Stored run {path} is not valid JSON ({error}); restore it from a backup."
            ) from None
        run = StoredRun.from_dict(data, where=path)
        if run.name != name:
            raise RunError(
                f"Stored run {path} holds a plan named {run.name!r}; file and plan names must agree."
            )
        self._known[name] = run
        return run

    def names(self) -> list[str]:
        return sorted(n[: -len(".json")] for n in fs.listdir(self._dir) if _is_run_file(n))

    def create(self, run: StoredRun) -> bool:
        """Stores ``run``; True if written, False if the same run was already stored.

        Within one process creates are serialised; two processes racing to create different plans
        under one new name at the same moment are not (the object store has no create-if-absent here).
        """
        with self._lock:
            existing = self.get(run.name)
            if existing is not None:
                if existing.to_dict() != run.to_dict():
                    raise RunConflictError(
                        f"Run {run.name!r} already exists with a different plan (fingerprint "
                        f"{existing.plan.fingerprint()}, split {existing.split!r}; the new one has "
                        f"{run.plan.fingerprint()}, split {run.split!r}). A run's data never changes once "
                        "created: choose another name."
                    )
                return False
            fs.write_atomic(self.path(run.name), run.to_bytes())
            self._known[run.name] = run
            return True


def _is_run_file(file_name: str) -> bool:
    if not file_name.endswith(".json"):
        return False
    try:
        validate_name(file_name[: -len(".json")], kind="run")
    except InvalidNameError:
        return False  # temporary files of an interrupted write, or anything else that is not a run
    return True


@dataclasses.dataclass(frozen=True)
class ResolvedCache:
    """A verified cache version of one task's split: where each shard is and where each record starts."""

    task: str
    fingerprint: str
    split: str
    version: str
    version_dir: str
    manifest: Manifest = dataclasses.field(repr=False)
    shard_uris: tuple[str, ...] = dataclasses.field(repr=False)
    offsets: tuple[np.ndarray, ...] = dataclasses.field(repr=False)

    # Every shard's offset table end to end (int64), and where each shard's table starts in it: one
    # array lookup finds the bytes of any number of reads (``byte_ranges``). ``offsets`` are views of it.
    flat_offsets: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    table_starts: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = self.manifest.split(self.split).record_counts
        if len(self.shard_uris) != len(counts) or len(self.offsets) != len(counts):
            raise CacheUnavailableError(
                self.task,
                f"{len(counts)} shards in the manifest but {len(self.shard_uris)} URIs and "
                f"{len(self.offsets)} offset tables were given.",
            )
        for shard, (table, count) in enumerate(zip(self.offsets, counts, strict=True)):
            if len(table) != count + 1:
                raise CacheUnavailableError(
                    self.task, f"shard {shard} has {count} records but {len(table) - 1} offsets."
                )
        # One copy, then the per-shard tables become views of it: memory stays one table per record.
        tables = [np.asarray(table, dtype=np.int64) for table in self.offsets]
        flat = np.concatenate(tables) if tables else np.zeros(0, np.int64)
        flat.flags.writeable = False
        starts = np.zeros(len(tables) + 1, np.int64)
        np.cumsum([len(table) for table in tables], out=starts[1:])
        object.__setattr__(self, "flat_offsets", flat)
        object.__setattr__(self, "table_starts", starts[:-1])
        object.__setattr__(self, "offsets", tuple(flat[a:b] for a, b in itertools.pairwise(starts.tolist())))

    def byte_range(self, shard: int, first_record: int, count: int) -> tuple[int, int]:
        """(byte offset, byte length) of records ``[first_record, first_record + count)`` of ``shard``."""
        table = self.offsets[shard]
        start = int(table[first_record])
        return start, int(table[first_record + count]) - start

    def byte_ranges(
        self, shards: np.ndarray, first_records: np.ndarray, counts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``byte_range`` of many reads at once (int64 arrays in, byte offsets and lengths out).

        The reads must lie inside their shards (as the index math's do); that is not checked here.
        """
        at = self.table_starts[shards] + first_records
        starts = self.flat_offsets[at]
        return starts, self.flat_offsets[at + counts] - starts


class CacheResolver:
    """(task, cache fingerprint, split) -> a verified ``ResolvedCache``, each resolved once per process."""

    def __init__(self, cache_root: str):
        self.cache_root = cache_root if fs.is_remote(cache_root) else os.path.abspath(cache_root)
        self._resolved: dict[tuple[str, str, str], ResolvedCache] = {}
        self._failed: dict[tuple[str, str, str], CacheUnavailableError] = {}
        self._locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._locks_lock = threading.Lock()

    def cached(self, run: StoredRun) -> tuple[ResolvedCache, ...] | None:
        """The run's caches if every one is resolved already (no I/O), else None."""
        plan, resolved = run.plan, self._resolved
        out = []
        for task in plan.task_names:
            cache = resolved.get((task, plan.caches[task].fingerprint, run.split))
            if cache is None:
                return None
            out.append(cache)
        return tuple(out)

    def resolve_run(self, run: StoredRun) -> tuple[ResolvedCache, ...]:
        """Every cache of ``run``, in ``plan.task_names`` order; CacheUnavailableError names the first problem."""
        plan = run.plan
        return tuple(
            self.resolve(
                task, plan.caches[task].fingerprint, run.split, plan.caches[task].shard_record_counts
            )
            for task in plan.task_names
        )

    def verification(self, task: str, fingerprint: str, split: str) -> str | None:
        """'verified', 'failed: <reason>' or None (not checked yet by this process)."""
        key = (task, fingerprint, split)
        if key in self._resolved:
            return "verified"
        failed = self._failed.get(key)
        return None if failed is None else f"failed: {failed.reason}"

    def resolve(
        self, task: str, fingerprint: str, split: str, record_counts: tuple[int, ...]
    ) -> ResolvedCache:
        key = (task, fingerprint, split)
        with self._locks_lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one verification per version, however many requests wait for it
            if key in self._resolved:
                cache = self._resolved[key]
            elif key in self._failed:
                raise self._failed[key]
            else:
                version_dir = self._find_version(task, fingerprint)
                try:
                    cache = self._load_verified(task, fingerprint, split, version_dir)
                except CacheUnavailableError as error:
                    self._failed[key] = error
                    raise
                self._resolved[key] = cache
        counts = cache.manifest.split(split).record_counts
        if counts != tuple(record_counts):
            raise CacheUnavailableError(
                task,
                f"the run's plan gives shard record counts {_abbreviate(record_counts)} but cache version "
                f"{cache.version} (manifest sha256 {fingerprint}) has {_abbreviate(counts)} in split {split!r}; "
                "the plan was edited by hand. Recreate the run from the cache.",
            )
        return cache

    def _find_version(self, task: str, fingerprint: str) -> str:
        root = task_dir(self.cache_root, task)  # validates the name; version names are pattern-checked
        version_dir = find_version(root, fingerprint)
        if version_dir is not None:
            return version_dir
        raise CacheUnavailableError(
            task,
            f"no complete version under {root} has manifest sha256 {fingerprint} (versions: "
            f"{list_versions(root) or 'none'}). Copy that version into the cache root, or create a new run "
            "from the current cache.",
        )

    def _load_verified(self, task: str, fingerprint: str, split: str, version_dir: str) -> ResolvedCache:
        from taskdata.tfrecord import read_offsets
        from taskdata.verify import verify_shards

        try:
            manifest = load_manifest(version_dir)
        except (CacheFormatError, OSError) as error:
            raise CacheUnavailableError(task, str(error)) from None
        if manifest.task != task:
            raise CacheUnavailableError(task, f"{version_dir} holds a cache of task {manifest.task!r}.")
        if split not in manifest.splits:
            raise CacheUnavailableError(
                task, f"{version_dir} has no split {split!r}; it has {sorted(manifest.splits)}."
            )
        # Only the split the run reads is verified: that is every byte it can serve.
        one_split = dataclasses.replace(manifest, splits={split: manifest.splits[split]})
        problems = verify_shards(version_dir, one_split)
        if problems:
            raise CacheUnavailableError(
                task,
                f"verification of {version_dir} failed: {problems[0]}. Run 'taskdata verify' on it and "
                "rebuild the cache; this server will not serve it until restarted.",
            )
        entries = manifest.split(split).shards
        offsets = []
        for entry in entries:
            path = fs.join(version_dir, entry.offsets_file)
            try:
                offsets.append(read_offsets(fs.read_bytes(path), path))
            except (OSError, ValueError) as error:
                raise CacheUnavailableError(task, f"offsets sidecar {path}: {error}") from None
        return ResolvedCache(
            task=task,
            fingerprint=fingerprint,
            split=split,
            version=version_dir.rstrip("/").rsplit("/", 1)[-1],
            version_dir=version_dir,
            manifest=manifest,
            shard_uris=tuple(fs.join(version_dir, entry.file) for entry in entries),
            offsets=tuple(offsets),
        )


def _abbreviate(values: Sequence[int], limit: int = 8) -> str:
    values = list(values)
    return str(values) if len(values) <= limit else f"{values[:limit]} ... ({len(values)} shards)"
