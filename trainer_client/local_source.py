"""``LocalAssignments``: read instructions from a local ``RunPlan`` and its cache versions, no HTTP.

It computes the same value as the server (``taskdata.index.step_slices``, one host slice alone: the
server cuts its answers from whole steps, which gives equal values), with byte ranges from each shard's
verified offsets sidecar, loaded for the shards a step reads only. For caches on an object store, the sidecars of every
shard a window of steps reads are fetched together before its instructions are computed (one round
trip per task and window, not one per shard). For tests, single-machine runs, and hosts that prefer
not to depend on a service.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from taskdata import fs
from taskdata.cache.format import CacheFormatError, find_version, list_versions, task_dir
from taskdata.cache.reader import CacheReader
from taskdata.index import (
    RunPlan,
    RunTables,
    StepReads,
    example_arrays,
    fits_int64,
    slice_positions,
    step_slices,
)
from taskdata.runs import StoredRun
from trainer_client.assignments import HostSlice, RunInfo
from trainer_client.shard_table import CacheReaderTable

__all__ = ["LocalAssignments"]


class LocalAssignments:
    """Instructions for ``plan`` over the cache versions in ``version_dirs`` (task -> version folder),
    reading the split the plan names."""

    def __init__(self, plan: RunPlan, version_dirs: Mapping[str, str]):
        missing = [t for t in plan.task_names if t not in version_dirs]
        if missing:
            raise ValueError(
                f"Run {plan.name!r} reads tasks {list(plan.task_names)}; no cache version folder for {missing}."
            )
        self._info = RunInfo(plan, plan.split)
        # The folders read, by task: read workers open the same ones to compute the same instructions.
        self.version_dirs = {task: _absolute(version_dirs[task]) for task in plan.task_names}
        # expected_manifest_sha256 refuses a folder holding other bytes than the plan pinned.
        self._readers = [
            CacheReader(self.version_dirs[task], expected_manifest_sha256=plan.caches[task].fingerprint)
            for task in plan.task_names
        ]
        self._tables = RunTables.of(plan, [CacheReaderTable(reader, plan.split) for reader in self._readers])

    @classmethod
    def from_cache_root(cls, run: StoredRun, cache_root: str) -> LocalAssignments:
        """The versions a stored run pins, found under ``cache_root`` by their manifest sha256.

        Unlike the server, a host does not verify whole caches up front (every host would read every
        byte); it verifies exactly the records it reads, as it reads them.
        """
        dirs = {}
        for task in run.plan.task_names:
            dirs[task] = _find_version(cache_root, task, run.plan.caches[task].fingerprint)
        return cls(run.plan, dirs)

    def run_info(self) -> RunInfo:
        return self._info

    @property
    def readers(self) -> dict[str, CacheReader]:
        """The cache readers of the run's version folders, by folder: a ``BatchReader`` given them reads
        each shard's sidecar once, with this source (they are safe to share with one reading thread)."""
        return {reader.version_dir: reader for reader in self._readers}

    def fetch(self, first_step: int, num_steps: int, host_slice: HostSlice) -> list[StepReads]:
        if any(fs.is_remote(reader.version_dir) for reader in self._readers):
            self._load_offsets(first_step, num_steps, host_slice)
        return [
            step_slices(self._tables, step, host_slice.count, only=host_slice.index)[0]
            for step in range(first_step, first_step + num_steps)
        ]

    def _load_offsets(self, first_step: int, num_steps: int, host_slice: HostSlice) -> None:
        """Loads the sidecars of every shard the window's steps read, per task all at once."""
        plan = self._info.plan
        if all(reader.offsets_loaded(plan.split) for reader in self._readers):
            return  # finding the shards is as much index math as the steps' own
        shards: list[set[int]] = [set() for _ in self._readers]
        for step in range(first_step, first_step + num_steps):
            if plan.is_skipped(step):
                continue
            positions = slice_positions(plan, step, host_slice.index, host_slice.count)
            if not fits_int64(plan, positions):
                return  # beyond int64 each step loads its own (the scalar index chain)
            arrays = example_arrays(plan, positions)
            for task in np.unique(arrays.tasks).tolist():
                shards[task].update(np.unique(arrays.shards[arrays.tasks == task]).tolist())
        for reader, wanted in zip(self._readers, shards, strict=True):
            reader.load_offsets(plan.split, wanted)

    def close(self) -> None:
        for reader in self._readers:
            reader.close()


def _find_version(cache_root: str, task: str, fingerprint: str) -> str:
    root = task_dir(cache_root, task)  # validates the name before it becomes part of a path
    version_dir = find_version(root, fingerprint)
    if version_dir is not None:
        return version_dir
    raise CacheFormatError(
        f"No complete version of task {task!r} under {root} has manifest sha256 {fingerprint} (versions: "
        f"{list_versions(root) or 'none'}). Copy that version into the cache root, or create a new run from "
        "the current cache."
    )


def _absolute(path: str) -> str:
    # The server names shards by absolute path; so do we, so that both sources give equal instructions.
    return path if fs.is_remote(path) else os.path.abspath(path)
