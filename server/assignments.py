"""``/shards`` answers as bytes: the index math of ``taskdata.index`` shaped into JSON, one step at a time.

A step is computed once for its whole global batch: ``example_arrays`` over every position, then the
read runs of every (data shard, task) in one grouped pass, their byte ranges in one gather per task
(``StepColumns``). Each host's answer is cut from that, so the 8 or 800 hosts of a step share its index
math and each answer only formats its own slice.

The answer is pre-shaped JSON text (no pydantic on the hot path; ``server.models.ShardsResponse``
documents the same shape, and the tests validate answers against it). Reads are columns of integers,
written as JSON arrays (``encoding=ints``) or as base64 of little-endian int64 (``encoding=base64``,
what the trainer client asks for: ~4x cheaper to write than decimal text). Each step's JSON depends
only on (run, plan fingerprint, data shard, step, encoding), so it is kept by that key in a bounded LRU;
nothing in it differs between processes, so any replica returns the same bytes. (A run's plan may gain
stages: the fingerprint in the key keeps answers of the plan before from being served after.)
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from taskdata.index import RunPlan, example_arrays, examples_at, fits_int64, read_runs, slice_positions
from taskdata.index.columns import ColumnEncoding, base64_int64
from taskdata.runs import ResolvedCache, StoredRun

__all__ = ["READ_COLUMNS", "AnswerCache", "StepColumns", "shards_body", "step_json"]

# Steps whose columns are kept: a lookahead window (<= 64 steps) of a few runs; ~100 KB each at 2,048.
_STEP_COLUMNS = 128
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode


READ_COLUMNS = ("shard", "first_record", "count", "byte_offset", "byte_length")


@dataclasses.dataclass(frozen=True, eq=False)
class StepColumns:
    """The reads of one step for every data shard (a "part") and task, as int64 columns.

    ``reads`` has one row per name of ``READ_COLUMNS`` and one column per read, little-endian (so a row
    slice is already the bytes ``encoding=base64`` writes). The reads of part ``p`` and task ``t`` are
    columns ``bounds[g]`` to ``bounds[g + 1]``, with ``g = p * num_tasks + t``; the distinct shards they
    read, ascending, are ``file_shards[file_bounds[g]:file_bounds[g + 1]]``. ``tasks`` is every
    example's task index, in order; part ``p`` holds examples ``p * per_part`` up to ``(p + 1) * per_part``.
    """

    num_tasks: int
    per_part: int
    bounds: list[int]
    reads: np.ndarray
    file_bounds: list[int]
    file_shards: np.ndarray
    tasks: np.ndarray

    @classmethod
    def from_runs(
        cls,
        caches: Sequence[ResolvedCache],
        num_parts: int,
        per_part: int,
        runs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        tasks: np.ndarray,
    ) -> StepColumns:
        """From grouped read runs ``(bounds, shards, first_records, counts)`` (as ``grouped_runs`` gives)."""
        bounds, shards, firsts, counts = runs
        num_tasks = len(caches)
        groups = num_parts * num_tasks
        group_of_run = np.repeat(np.arange(groups), np.diff(bounds))
        reads = np.empty((len(READ_COLUMNS), len(shards)), "<i8")
        reads[0], reads[1], reads[2] = shards, firsts, counts
        task_of_run = group_of_run % num_tasks
        for t, cache in enumerate(caches):
            mine = np.flatnonzero(task_of_run == t)
            reads[3, mine], reads[4, mine] = cache.byte_ranges(shards[mine], firsts[mine], counts[mine])
        # Distinct (group, shard) pairs, sorted: each group's shard files, ascending.
        stride = max((len(cache.shard_uris) for cache in caches), default=1)
        pairs = np.sort(group_of_run * stride + shards)
        if len(pairs):
            pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))]
        file_bounds = np.searchsorted(pairs // stride, np.arange(groups + 1))
        return cls(
            num_tasks=num_tasks,
            per_part=per_part,
            bounds=bounds.tolist(),
            reads=reads,
            file_bounds=file_bounds.tolist(),
            file_shards=pairs % stride,
            tasks=tasks.astype("<i8", copy=False),
        )


def step_columns(plan: RunPlan, caches: Sequence[ResolvedCache], step: int) -> StepColumns | None:
    """The whole global batch of ``step``, every data shard at once (None past int64: ``_scalar_columns``)."""
    positions = plan.positions(step)
    if not fits_int64(plan, positions):
        return None
    arrays = example_arrays(plan, positions)
    parts = plan.num_data_shards
    runs = arrays.grouped_runs(parts, len(caches))
    return StepColumns.from_runs(caches, parts, len(arrays) // parts, runs, arrays.tasks)


def _scalar_columns(
    plan: RunPlan, caches: Sequence[ResolvedCache], positions: range, memory: AnswerCache
) -> StepColumns:
    """One data shard's ``StepColumns`` (a single part) for positions beyond int64, by the exact scalar chain.

    Within a task, consecutive records make one read even when other tasks' examples fall between
    them, as in ``grouped_runs``. Shards and records are small numbers whatever the position.
    """
    index = memory.task_indices(plan)
    per_task: list[list[list[int]]] = [[] for _ in caches]
    order: list[int] = []
    for read in read_runs(examples_at(plan, positions)):
        t = index[read.task]
        order += [t] * read.count
        reads = per_task[t]
        if reads and reads[-1][0] == read.shard and reads[-1][1] + reads[-1][2] == read.first_record:
            reads[-1][2] += read.count
        else:
            reads.append([read.shard, read.first_record, read.count])
    table = np.array([r for reads in per_task for r in reads], np.int64).reshape(-1, 3)
    bounds = np.cumsum([0] + [len(reads) for reads in per_task])
    runs = (bounds, table[:, 0], table[:, 1], table[:, 2])
    return StepColumns.from_runs(caches, 1, len(positions), runs, np.array(order, np.int64))


def step_json(
    run: StoredRun,
    caches: Sequence[ResolvedCache],
    data_shard: int,
    step: int,
    memory: AnswerCache,
    encoding: ColumnEncoding = "ints",
) -> bytes:
    """The JSON of one step (``server.models.StepReads``) for one data shard."""
    plan = run.plan
    positions = slice_positions(plan, step, data_shard)
    skipped = plan.is_skipped(step)
    part = data_shard
    if skipped:
        columns, part = memory.empty_columns(caches), 0
    else:
        columns = memory.step_columns(run.name, plan, caches, step)
        if columns is None:
            columns, part = _scalar_columns(plan, caches, positions, memory), 0
    tasks = []
    write = _base64_column if encoding == "base64" else _int_column
    reads = columns.reads
    for t, cache in enumerate(caches):
        encoded = memory.encoded(cache)
        g = part * columns.num_tasks + t
        a, b = columns.bounds[g], columns.bounds[g + 1]
        files = encoded.files_json(columns.file_shards[columns.file_bounds[g] : columns.file_bounds[g + 1]])
        tasks.append(
            f'{{"task":{encoded.task},"version":{encoded.version},"files":[{files}],"reads":{{'
            f'"shard":{write(reads[0, a:b])},"first_record":{write(reads[1, a:b])},"count":{write(reads[2, a:b])},'
            f'"byte_offset":{write(reads[3, a:b])},"byte_length":{write(reads[4, a:b])}}}}}'
        )
    order = columns.tasks[part * columns.per_part : (part + 1) * columns.per_part]
    # Every value is an int, or a string encoded once per cache version: plain formatting yields
    # exactly what json.dumps would (tests parse and compare every answer).
    return (
        f'{{"step":{step},"skipped":{"true" if skipped else "false"},'
        f'"global_batch_size":{plan.batch_size(step)},'
        f'"positions":{{"start":{positions.start},"stop":{positions.stop}}},'
        f'"tasks":[{",".join(tasks)}],"order":{write(order)}}}'
    ).encode()


def _int_column(values: np.ndarray) -> str:
    return f"[{','.join(map(str, values.tolist()))}]"


def _base64_column(values: np.ndarray) -> str:
    return f'"{base64_int64(values)}"'


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


@dataclasses.dataclass(frozen=True)
class _Encoded:
    task: str  # JSON strings
    version: str
    # Row s: shard s's JSON object {"shard": s, "uri": ...} and a comma, NUL-padded to a fixed width.
    # One gather copies the rows of any shards; with 65,536 shards that is ~5x faster than joining
    # 65,536 separate strings, whose scattered objects each cost a cache miss.
    files: np.ndarray

    @classmethod
    def of(cls, cache: ResolvedCache) -> _Encoded:
        rows = [_dumps({"shard": i, "uri": uri}).encode() + b"," for i, uri in enumerate(cache.shard_uris)]
        return cls(task=_dumps(cache.task), version=_dumps(cache.version), files=np.array(rows, dtype=bytes))

    def files_json(self, shards: np.ndarray) -> str:
        """The JSON objects of ``shards``' files, comma-separated (the text inside ``[...]``)."""
        # JSON text here is ASCII (ensure_ascii) and holds no NUL byte: dropping NULs drops the padding.
        return self.files[shards].tobytes().replace(b"\0", b"")[:-1].decode("ascii")


class AnswerCache:
    """What the server remembers to answer fast, all of it pure functions of immutable inputs.

    - serialized steps, a bounded, thread-safe LRU keyed by (run name, plan fingerprint, data shard, step,
      encoding): a stored run's plan only changes by gaining stages (``taskdata.runs.RunStore``), which
      changes its fingerprint, and the caches it pins are found by manifest hash;
    - each step's ``StepColumns`` for all its data shards, in a small LRU keyed by (run name, plan
      fingerprint, step);
    - per cache version, its task name, version and shard files as JSON text (encoded once);
    - per plan, task name -> index.
    """

    def __init__(self, max_entries: int):
        self._max = max_entries
        self._entries: OrderedDict[tuple[str, str, int, int, str], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._encoded: dict[tuple[str, str], _Encoded] = {}
        self._columns: OrderedDict[tuple[str, str, int], StepColumns] = OrderedDict()
        self._indices: dict[str, dict[str, int]] = {}
        self._empty: dict[int, StepColumns] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, str, int, int, str]) -> bytes | None:
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
                self._entries.move_to_end(key)
            return value

    def put(self, key: tuple[str, str, int, int, str], value: bytes) -> None:
        if self._max == 0:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def encoded(self, cache: ResolvedCache) -> _Encoded:
        key = (cache.version_dir, cache.split)
        found = self._encoded.get(key)
        if found is None:  # two threads may both encode: equal results, so either one is right
            found = self._encoded[key] = _Encoded.of(cache)
        return found

    def step_columns(
        self, run_name: str, plan: RunPlan, caches: Sequence[ResolvedCache], step: int
    ) -> StepColumns | None:
        """``step_columns`` of ``step``, from a small LRU (two threads may both compute: equal results)."""
        key = (run_name, plan.fingerprint(), step)
        with self._lock:
            found = self._columns.get(key)
            if found is not None:
                self._columns.move_to_end(key)
                return found
        columns = step_columns(plan, caches, step)
        if columns is not None:
            with self._lock:
                self._columns[key] = columns
                while len(self._columns) > _STEP_COLUMNS:
                    self._columns.popitem(last=False)
        return columns

    def clear_step_columns(self) -> None:
        """Forgets every step's columns (benchmarks use it to time a step's index math alone)."""
        with self._lock:
            self._columns.clear()

    def empty_columns(self, caches: Sequence[ResolvedCache]) -> StepColumns:
        """No reads of any task (a skipped step)."""
        found = self._empty.get(len(caches))
        if found is None:
            nothing = np.zeros(0, np.int64)
            runs = (np.zeros(len(caches) + 1, np.int64), nothing, nothing, nothing)
            found = self._empty[len(caches)] = StepColumns.from_runs(caches, 1, 0, runs, nothing)
        return found

    def task_indices(self, plan: RunPlan) -> dict[str, int]:
        found = self._indices.get(plan.fingerprint())
        if found is None:
            found = self._indices[plan.fingerprint()] = {name: i for i, name in enumerate(plan.task_names)}
        return found
