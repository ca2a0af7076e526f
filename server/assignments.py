"""``/shards`` answers as bytes: the reads of ``taskdata.index`` for a host slice, cached and wrapped.

A step's reads can be computed for one host slice alone (``taskdata.index.step_slices(..., only=i)``) or
for all its slices at once (``taskdata.index.step_slices``, ~2.5x the time of one slice at 8 slices, since most of
the cost is per call); both give equal values for a slice (``tests/test_index_reads.py``). Which one a
request gets depends on how the run's hosts have been asking: when one of the last two steps a run's
hosts started on was asked for by more than one host (hosts in step, or a pod's lookahead windows), the
first host of a new step computes the whole step and its other hosts cut their answers from it; when
both were asked for once (every request for another step), a new step's first host computes its own
slice alone, and a second host of that step computes the whole step. (Two steps, not one: requests
for consecutive steps overlap, and the first of a step may come before the second of the step
before.) Whole steps are kept in a small LRU, and a whole step is computed once: hosts asking for it meanwhile
wait for it. While hosts share steps, an answered window's next window is computed whole in a background
thread (``AnswerCache.ahead``), so that a pod's hosts moving on to it find it ready.

Each step's JSON (``taskdata.index.to_json``, written by the step's ``taskdata.index.StepJson``, which does
what all slices of a step share once) depends only on (run, plan fingerprint, host slice, step,
encoding), so it is kept by that key in a bounded LRU; nothing in it differs between processes,
so any replica returns the same bytes. (A run's plan may gain stages: the fingerprint in the key keeps
answers of the plan before from being served after.) ``server.models.ShardsResponse`` documents the
shape; the tests validate answers against it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

from taskdata.index import CacheFiles, RunTables, StepJson, StepReads, StepSlices, step_slices
from taskdata.index.columns import ColumnEncoding
from taskdata.runs import ResolvedCache, StoredRun

__all__ = ["AnswerCache", "shards_body", "step_json"]

# Steps remembered (whole ones with their slices, ~100 KB each at 2,048): a lookahead window (<= 64
# steps) of a few runs.
_STEPS = 128
_log = logging.getLogger(__name__)
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
    return memory.step_json(run, tables, step, index, count, encoding)


def shards_body(
    run: StoredRun, host: int, num_hosts: int, data_shard: int, last_step: int, steps: Sequence[bytes]
) -> bytes:
    """The whole ``server.models.ShardsResponse`` around already serialized steps, up to ``last_step``.

    Its fingerprint is that of what decides the steps up to ``last_step`` (``RunPlan.fingerprint_before``):
    a stage appended later in the run leaves the answer of every earlier step unchanged, byte for byte.
    """
    head = _head(run.name, run.plan.fingerprint_before(last_step + 1), run.split)
    numbers = b'%d,"num_hosts":%d,"data_shard":%d,"num_data_shards":%d,"steps":[' % (
        host,
        num_hosts,
        data_shard,
        run.plan.num_data_shards,
    )
    return b"".join((head, numbers, b",".join(steps), b"]}"))


@functools.lru_cache(maxsize=256)
def _head(run: str, fingerprint: str, split: str) -> bytes:
    """The answer's text up to the host number (its strings as ``json`` escapes them), kept per run."""
    return b'{"run":%s,"fingerprint":%s,"split":%s,"host":' % (
        _dumps(run).encode(),
        _dumps(fingerprint).encode(),
        _dumps(split).encode(),
    )


@dataclasses.dataclass
class _Step:
    """What the cache knows of a step of a run cut into host slices: how often a slice of it was computed
    or cut, and the whole step once computed."""

    asked: int = 0
    slices: StepSlices | None = None
    # Held while one thread computes the whole step: the step's other hosts wait for it instead of computing it
    # again each (a pod's hosts of a new window arrive while its first one computes).
    computing: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    # Per encoding, the writer of the step's slices' JSON (what is the same for every slice, done once).
    json: dict[str, StepJson] = dataclasses.field(default_factory=dict)


class AnswerCache:
    """What the server remembers to answer fast, all of it pure functions of immutable inputs.

    - serialized steps, a bounded, thread-safe LRU keyed by (run name, plan fingerprint, slice count,
      slice index, step, encoding): a stored run's plan only changes by gaining stages
      (``taskdata.runs.RunStore``), which changes its fingerprint, and the caches it pins are found by
      manifest hash;
    - per step, keyed by (run name, plan fingerprint, step, slice count) in a small LRU, how often it was
      asked for and its ``StepSlices`` once computed whole; per (run name, plan fingerprint, slice
      count), the last two steps its hosts started on;
    - per run, its ``RunTables`` of its current plan (rebuilt when the run gains a stage); per cache
      version, its ``CacheFiles`` (file JSON encoded once), shared by the runs that read it.
    """

    def __init__(self, max_entries: int):
        self._max = max_entries
        self._entries: OrderedDict[tuple[str, str, int, int, int, str], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str], CacheFiles] = {}
        self._tables: dict[str, RunTables] = {}
        self._steps: OrderedDict[tuple[str, str, int, int], _Step] = OrderedDict()
        self._latest: OrderedDict[tuple[str, str, int], tuple[_Step, ...]] = OrderedDict()
        self._ahead_running = False
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

    def kept(self, run: str, tables: RunTables, step: int, count: int) -> bool:
        """Whether ``step`` is kept whole (cut into ``count`` slices): a slice of it needs no index math, only
        its JSON. (Not a use: the LRU order stays.)"""
        with self._lock:
            return self._kept_whole((run, tables.plan.fingerprint(), step, count))

    def step_reads(self, run: str, tables: RunTables, step: int, index: int, count: int) -> StepReads:
        """Slice ``index`` of ``count`` at ``step``: cut from the whole step, or computed alone when the
        step is new and the run's last two new steps were asked for once each (module docstring). A whole
        step is computed once: its other askers wait for it."""
        slices, at, _ = self._slices(run, tables, step, index, count)
        return slices[at]

    def step_json(
        self, run: str, tables: RunTables, step: int, index: int, count: int, encoding: ColumnEncoding
    ) -> bytes:
        """``to_json`` of ``step_reads``, written by the step's ``StepJson`` (kept with the whole step)."""
        slices, at, entry = self._slices(run, tables, step, index, count)
        if entry is None:
            return StepJson(slices, encoding)[at]
        return self._writer(entry, slices, encoding)[at]

    def ahead(self, run: str, tables: RunTables, steps: range, count: int, encoding: ColumnEncoding) -> None:
        """Computes ``steps`` whole (cut into ``count`` slices) and their JSON's shared part in a background
        thread, when ``run``'s hosts share steps: a pod's next lookahead window is ready before its hosts ask
        for it, instead of its first host computing it while the others wait. Only while a step of the window
        is not kept whole (whatever windows came before: a pod resumed at an earlier checkpoint asks for
        lower steps again); one such thread per cache at a time (a call while it runs does nothing)."""
        fingerprint = tables.plan.fingerprint()
        run_key = (run, fingerprint, count)
        with self._lock:
            shared = count == 1 or any(other.asked > 1 for other in self._latest.get(run_key, ()))
            if not shared or self._ahead_running or all(self._kept_whole((run, fingerprint, s, count)) for s in steps):
                return
            self._ahead_running = True

        def compute() -> None:
            try:
                for step in steps:
                    entry = self._entry((run, fingerprint, step, count))
                    self._writer(entry, self._whole(entry, tables, step, count), encoding)
                    time.sleep(0.001)  # lets requests waiting for the interpreter in between steps
            except Exception:  # a request for such a step computes it again and answers its error
                _log.debug("computing steps %s of run %r ahead failed", steps, run, exc_info=True)
            finally:
                with self._lock:
                    self._ahead_running = False

        threading.Thread(target=compute, name="taskdata-steps-ahead", daemon=True).start()

    def _kept_whole(self, key: tuple[str, str, int, int]) -> bool:
        entry = self._steps.get(key)
        return entry is not None and entry.slices is not None

    def _entry(self, key: tuple[str, str, int, int]) -> _Step:
        """The step's entry, made if new (not an ask: neither counted nor one of the run's latest steps)."""
        with self._lock:
            entry = self._steps.get(key)
            if entry is None:
                entry = self._steps[key] = _Step()
                self._forget_oldest()
            return entry

    def _forget_oldest(self) -> None:
        for memory in (self._steps, self._latest):
            while len(memory) > _STEPS:
                memory.popitem(last=False)

    @staticmethod
    def _whole(entry: _Step, tables: RunTables, step: int, count: int) -> StepSlices:
        """The entry's whole step, computed by the first thread that needs it while the others wait."""
        with entry.computing:
            if entry.slices is None:
                # An entry pushed out of the LRU meanwhile is dropped with what it holds: the bound stands.
                entry.slices = step_slices(tables, step, count)
            return entry.slices

    @staticmethod
    def _writer(entry: _Step, slices: StepSlices, encoding: ColumnEncoding) -> StepJson:
        writer = entry.json.get(encoding)
        if writer is None:
            with entry.computing:  # made once, like the step
                writer = entry.json.get(encoding)
                if writer is None:
                    writer = entry.json[encoding] = StepJson(slices, encoding)
        return writer

    def _slices(
        self, run: str, tables: RunTables, step: int, index: int, count: int
    ) -> tuple[StepSlices, int, _Step | None]:
        """(a ``StepSlices``, the slice's index in it, the step's entry if it holds them): the whole step,
        or the slice computed alone (``step_slices(..., only=index)``), with no entry."""
        fingerprint = tables.plan.fingerprint()
        key, run_key = (run, fingerprint, step, count), (run, fingerprint, count)
        with self._lock:
            entry = self._steps.get(key)
            if entry is None:
                latest = self._latest.get(run_key, ())
                whole = count == 1 or any(other.asked > 1 for other in latest)
                entry = self._steps[key] = _Step()
                self._latest[run_key] = (entry, *latest[:1])
                self._latest.move_to_end(run_key)
                self._forget_oldest()
            else:
                whole = True
                self._steps.move_to_end(key)
            entry.asked += 1
            slices = entry.slices
        if slices is None:
            if not whole:
                return step_slices(tables, step, count, only=index), 0, None
            slices = self._whole(entry, tables, step, count)
        return slices, index, entry

    def clear_step_slices(self) -> None:
        """Forgets every step (benchmarks use it to time a step's index math alone)."""
        with self._lock:
            self._steps.clear()
            self._latest.clear()
