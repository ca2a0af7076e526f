"""``/shards`` answers as bytes: the reads of ``taskdata.index`` for a host slice, cached and wrapped.

The first host to ask for a step gets its own slice computed alone (``taskdata.index.step_reads``):
when every request is for another step, nothing is computed for hosts that never ask. The second host
of a step gets the whole step computed for all its slices (``taskdata.index.step_slices``), kept in a
small LRU, and every later host of that step cuts its answer from it: the 8 or 800 hosts of a step share
its index math. Both give equal values for a slice (``tests/test_index_reads.py``). Each step's JSON
(``taskdata.index.to_json``) depends only on (run, plan fingerprint, host slice, step, encoding), so it
is kept by that key in a bounded LRU; nothing in it differs between processes, so any replica returns
the same bytes. (A run's plan may gain stages: the fingerprint in the
key keeps answers of the plan before from being served after.) ``server.models.ShardsResponse``
documents the shape; the tests validate answers against it.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence

from taskdata.index import CacheFiles, RunTables, StepReads, StepSlices, step_reads, step_slices, to_json
from taskdata.index.columns import ColumnEncoding
from taskdata.runs import ResolvedCache, StoredRun

__all__ = ["AnswerCache", "shards_body", "step_json"]

# Steps whose slices are kept (or marked as asked for once): a lookahead window (<= 64 steps) of a few
# runs; ~100 KB each at 2,048.
_STEP_SLICES = 128
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode


def step_json(
    memory: AnswerCache,
    run: str,
    tables: RunTables,
    step: int,
    index: int,
    count: int,
    encoding: ColumnEncoding,
) -> bytes:
    """The JSON of one step (``server.models.StepReads``) for host slice ``index`` of ``count``."""
    return to_json(memory.step_reads(run, tables, step, index, count), encoding)


def shards_body(
    run: StoredRun, host: int, num_hosts: int, data_shard: int, last_step: int, steps: Sequence[bytes]
) -> bytes:
    """The whole ``server.models.ShardsResponse`` around already serialized steps, up to ``last_step``.

    Its fingerprint is that of what decides the steps up to ``last_step`` (``RunPlan.fingerprint_before``):
    a stage appended later in the run leaves the answer of every earlier step unchanged, byte for byte.
    """
    head = _dumps(
        {
            "run": run.name,
            "fingerprint": run.plan.fingerprint_before(last_step + 1),
            "split": run.split,
            "host": host,
            "num_hosts": num_hosts,
            "data_shard": data_shard,
            "num_data_shards": run.plan.num_data_shards,
        }
    )
    return b"".join((head[:-1].encode(), b',"steps":[', b",".join(steps), b"]}"))


class AnswerCache:
    """What the server remembers to answer fast, all of it pure functions of immutable inputs.

    - serialized steps, a bounded, thread-safe LRU keyed by (run name, plan fingerprint, slice count,
      slice index, step, encoding): a stored run's plan only changes by gaining stages
      (``taskdata.runs.RunStore``), which changes its fingerprint, and the caches it pins are found by
      manifest hash;
    - each step's ``StepSlices``, in a small LRU keyed by (run name, plan fingerprint, step, slice count),
      which also marks the steps of which one slice was computed alone;
    - per run, its ``RunTables`` of its current plan (rebuilt when the run gains a stage); per cache
      version, its ``CacheFiles`` (file JSON encoded once), shared by the runs that read it.
    """

    def __init__(self, max_entries: int):
        self._max = max_entries
        self._entries: OrderedDict[tuple[str, str, int, int, int, str], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str], CacheFiles] = {}
        self._tables: dict[str, RunTables] = {}
        # None: one slice of the step was computed alone; the next host of that step computes them all.
        self._slices: OrderedDict[tuple[str, str, int, int], StepSlices | None] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, str, int, int, int, str]) -> bytes | None:
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
                self._entries.move_to_end(key)
            return value

    def put(self, key: tuple[str, str, int, int, int, str], value: bytes) -> None:
        if self._max == 0:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def tables(self, run: StoredRun, caches: Sequence[ResolvedCache]) -> RunTables:
        """``run``'s ``RunTables`` over its resolved ``caches`` (two threads may both build: equal results).

        A stored run may gain stages: tables of another plan of the run (the one before) are replaced.
        """
        found = self._tables.get(run.name)
        if found is None or found.plan.fingerprint() != run.plan.fingerprint():
            files = []
            for cache in caches:
                key = (cache.version_dir, cache.split)
                if key not in self._files:
                    self._files[key] = CacheFiles.of(cache.task, cache.version, cache.shard_uris)
                files.append(self._files[key])
            found = self._tables[run.name] = RunTables(run.plan, tuple(caches), tuple(files))
        return found

    def prepare(self, run: StoredRun, caches: Sequence[ResolvedCache]) -> None:
        """Builds ``run``'s tables and encodes its files' JSON (~1 s for 65,536 shards): not in a request."""
        for files in self.tables(run, caches).files:
            files.file_rows  # noqa: B018 (a cached property: computing it is the point)

    def step_reads(self, run: str, tables: RunTables, step: int, index: int, count: int) -> StepReads:
        """Slice ``index`` of ``count`` at ``step``: alone for the step's first host, else cut from the whole
        step, computed by its second host and kept in a small LRU (two threads may both compute: equal results).
        """
        key = (run, tables.plan.fingerprint(), step, count)
        with self._lock:
            asked = key in self._slices
            found = self._slices.get(key)
            self._slices[key] = found
            self._slices.move_to_end(key)
            while len(self._slices) > _STEP_SLICES:
                self._slices.popitem(last=False)
        if found is not None:
            return found[index]
        if not asked and count > 1:
            return step_reads(tables, step, index, count)
        slices = step_slices(tables, step, count)
        with self._lock:
            if key in self._slices:  # not pushed out meanwhile: the LRU stays within its bound
                self._slices[key] = slices
        return slices[index]

    def clear_step_slices(self) -> None:
        """Forgets every step's slices (benchmarks use it to time a step's index math alone)."""
        with self._lock:
            self._slices.clear()
