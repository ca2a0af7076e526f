"""``CacheResolver`` turns (task, cache fingerprint, split) back into the version folder whose manifest
hash matches (whatever ``CURRENT`` says now: a rebuild never moves a running job to other data). It
verifies that version's split once, on first use, at its ``level`` (``full`` re-reads every byte;
``listing`` checks sizes and sidecars, reading no record: see ``taskdata.cache.verify``), and keeps its
manifest and every shard's record offsets in memory (8 bytes per record); a failure is remembered too.

Its errors name files relative to the cache root (``toy_det/v.../manifest.json``): the server answers
with them, and an answer never shows the server's own file system.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
from collections.abc import Sequence
from typing import get_args

import numpy as np

from taskdata import fs
from taskdata.cache.format import (
    CacheFormatError,
    Manifest,
    find_version,
    list_versions,
    load_manifest,
    task_dir,
)
from taskdata.cache.tfrecord import flat_byte_ranges
from taskdata.cache.verify import Level
from taskdata.runs.store import CacheUnavailableError, StoredRun

__all__ = ["CacheResolver", "ResolvedCache"]


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
        return flat_byte_ranges(self.flat_offsets, self.table_starts, shards, first_records, counts)


class CacheResolver:
    """(task, cache fingerprint, split) -> a verified ``ResolvedCache``, each resolved once per process."""

    def __init__(self, cache_root: str, *, level: Level = "full", workers: int = 1):
        if level not in get_args(Level):
            raise ValueError(f"Verification level must be one of {get_args(Level)} but got {level!r}.")
        self.level = level
        self.workers = workers
        self.cache_root = cache_root if fs.is_remote(cache_root) else os.path.abspath(cache_root)
        self._root = self.cache_root.rstrip("/")
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
        """'verified' (every byte), 'listing verified' (sizes and sidecars; records are verified as they are
        read), 'failed: <reason>' or None (not checked yet by this process)."""
        key = (task, fingerprint, split)
        if key in self._resolved:
            return "verified" if self.level == "full" else "listing verified"
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

    def relative(self, text: str) -> str:
        """``text`` with every path under the cache root written relative to it, and the root itself as
        ``<cache root>``."""
        if not self._root:  # the file system's root: every path is its own relative path, less a '/'
            return text
        return text.replace(self._root + "/", "").replace(self._root, "<cache root>")

    def _unavailable(self, task: str, reason: str) -> CacheUnavailableError:
        return CacheUnavailableError(task, self.relative(reason))

    def _find_version(self, task: str, fingerprint: str) -> str:
        root = task_dir(self.cache_root, task)  # validates the name; version names are pattern-checked
        try:
            version_dir = find_version(root, fingerprint)
        except CacheFormatError as error:  # a damaged CURRENT pointer
            raise self._unavailable(task, str(error)) from None
        if version_dir is not None:
            return version_dir
        raise self._unavailable(
            task,
            f"no complete version under {root}/ has manifest sha256 {fingerprint} (versions: "
            f"{list_versions(root) or 'none'}). Copy that version into the cache root, or create a new run "
            "from the current cache.",
        )

    def _load_verified(self, task: str, fingerprint: str, split: str, version_dir: str) -> ResolvedCache:
        from taskdata.cache.verify import check_split

        try:
            manifest = load_manifest(version_dir)
        except (CacheFormatError, OSError) as error:
            raise self._unavailable(task, str(error)) from None
        if manifest.task != task:
            raise self._unavailable(task, f"{version_dir} holds a cache of task {manifest.task!r}.")
        if split not in manifest.splits:
            raise self._unavailable(task, f"{version_dir} has no split {split!r}; it has {sorted(manifest.splits)}.")
        # Only the split the run reads is verified: that is every byte it can serve.
        try:
            check = check_split(version_dir, split, manifest.splits[split], level=self.level, workers=self.workers)
        except OSError as error:
            raise self._unavailable(task, f"verification of {version_dir} could not read it: {error}") from None
        if not check.ok:
            raise self._unavailable(
                task,
                f"verification of {version_dir} failed: {check.problems[0]}. Run 'taskdata verify' on it and "
                "rebuild the cache; this server will not serve it until restarted.",
            )
        entries = manifest.split(split).shards
        return ResolvedCache(
            task=task,
            fingerprint=fingerprint,
            split=split,
            version=version_dir.rstrip("/").rsplit("/", 1)[-1],
            version_dir=version_dir,
            manifest=manifest,
            shard_uris=tuple(f"{version_dir.rstrip('/')}/{entry.file}" for entry in entries),
            offsets=check.offsets,
        )


def _abbreviate(values: Sequence[int], limit: int = 8) -> str:
    values = list(values)
    return str(values) if len(values) <= limit else f"{values[:limit]} ... ({len(values)} shards)"
