"""The ledger of a run, both ways: which examples a step read, and at which steps one example is read.

By step: the index math gives every example of the step (or of one data shard's slice) as (task,
epoch, cache shard, record), exactly what ``/shards`` hands out; each record's provenance
(``taskdata.cache.provenance``) adds its stable id (task/split/source shard/ordinal), its source file and
the range of source documents it was made from. Caches built since origins sidecars exist
(``taskdata.cache.origins``: every record's ``provenance/origin`` beside its shard, checked against the
manifest on first use) give it as rows of an array, taken by index: no record is read. Older caches
(format 4 before the sidecars, formats 2 and 3) give it by reading the records: one verified read per
example, done per task as one gathered read and one decode of the provenance feature. Either way the
answer is kept as columns (``StepLedgerColumns``) and made into entries only when asked.

By example: a stable id names no place in the cache, but its shuffle key (a keyed hash of the cache's
seed and the id: ``taskdata.cache.shuffle``) names the shard (a key range), and inside the shard the
records are sorted by that key. So a search finds the record, each probe taking one record's provenance
(its sidecar row, or the record itself) and hashing it again. The keys are a uniform hash, so the search
interpolates: the key says how far into the shard's key range the record lies, which is about how far
into the shard it is. That takes ~4 probes in a 100,000-record shard (a binary search takes 17, what
matters when each probe is a read on a remote file system); every third probe bisects, so no spread of
keys costs more than about three times the binary search. From the record,
``taskdata.index.occurrences`` inverts the index math epoch by epoch: O(reads listed).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from taskdata import fs
from taskdata.cache.format import CacheFormatError, find_version, list_versions, task_dir
from taskdata.cache.origins import OriginTable
from taskdata.cache.provenance import (
    ORIGIN_WIDTH,
    Provenance,
    origins_provenance,
    provenance_spec,
    read_provenance,
)
from taskdata.cache.reader import CacheReader
from taskdata.cache.shuffle import shard_of_key, shuffle_key
from taskdata.example import RaggedFeature, decode_example
from taskdata.index import (
    Occurrence,
    PlanError,
    RunPlan,
    example_arrays,
    examples_at,
    fits_int64,
    host_slice_for,
    occurrences,
    reads_before,
    slice_positions,
)
from taskdata.seeding import format_example_id, parse_example_id

__all__ = [
    "ExampleLedger",
    "LedgerEntry",
    "LedgerError",
    "StepLedger",
    "StepLedgerColumns",
    "TaskCacheView",
    "example_ledger",
    "open_views",
    "step_ledger",
]

class LedgerError(ValueError):
    """A ledger question that cannot be answered as asked (an unknown example id, another split...)."""


ByteRanges = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


class TaskCacheView:
    """One task's pinned cache version as the ledger and the summary read it: record provenance, record
    sizes and statistics. Thread-safe (a ``CacheReader`` is not: reads take one lock per task).

    ``byte_ranges`` (optional): where records lie, as ``ResolvedCache.byte_ranges`` (the server has every
    shard's offsets in memory); by default each shard's verified offsets sidecar, read on first use.
    """

    def __init__(self, reader: CacheReader, split: str, *, byte_ranges: ByteRanges | None = None):
        self.reader = reader
        self.split = split
        self.task = reader.task
        self.seed = reader.manifest.seed
        self.record_counts = reader.record_counts(split)
        self._byte_ranges = byte_ranges
        self._lock = threading.Lock()
        self._stats: dict[str, Any] | None = None
        self._has_origins = reader.manifest.split(split).origins is not None
        try:
            self._spec = provenance_spec(reader.manifest)
        except CacheFormatError as error:
            raise LedgerError(f"{reader.version_dir}: {error}") from None

    @classmethod
    def open(cls, cache_root: str, task: str, fingerprint: str, split: str) -> TaskCacheView:
        """The complete version of ``task`` under ``cache_root`` whose manifest sha256 is ``fingerprint``."""
        root = task_dir(cache_root, task)  # validates the name before it becomes part of a path
        version_dir = find_version(root, fingerprint)
        if version_dir is None:
            raise CacheFormatError(
                f"No complete version of task {task!r} under {root} has manifest sha256 {fingerprint} (versions: "
                f"{list_versions(root) or 'none'}): the run's cache is not here. Point --cache-root at the cache "
                "root the run was planned over."
            )
        return cls(CacheReader(version_dir, expected_manifest_sha256=fingerprint), split)

    def provenance(self, shards: np.ndarray, records: np.ndarray) -> Provenance:
        """The provenance of the records at (``shards[i]``, ``records[i]``), in that order: their rows of the
        shards' origins sidecars where the cache has them; else one verified read and one decode of the
        provenance features for all of them."""
        self._refuse_packed()
        shards, records = np.asarray(shards, np.int64), np.asarray(records, np.int64)
        with self._lock:
            if self._has_origins:
                rows = np.empty((len(records), ORIGIN_WIDTH), np.int64)
                for shard in np.unique(shards).tolist():
                    mine = np.flatnonzero(shards == shard)
                    rows[mine] = self._origins(shard).rows(self._in_range(shard, records[mine]))
            else:
                decoded = self.reader.decode_records(self.split, shards, records, self._spec)
        if self._has_origins:
            return origins_provenance(self.reader.manifest, self.split, rows)
        return read_provenance(self.reader.manifest, self.split, decoded)

    def _origins(self, shard: int) -> OriginTable:
        table = self.reader.shard_origins(self.split, shard)
        assert table is not None  # the manifest lists the split's origins sidecars
        return table

    def _in_range(self, shard: int, records: np.ndarray) -> np.ndarray:
        # numpy would read a negative record from the end: a record the read plan names must be in the shard.
        count = self.record_counts[shard]
        if len(records) and (records.min() < 0 or records.max() >= count):
            bad = int(records[(records < 0) | (records >= count)][0])
            raise IndexError(f"Shard {shard} of task {self.task!r} has {count} records; record {bad} is out of range. "
                             "The read plan does not match this cache version.")
        return records

    def ids(self, shards: np.ndarray, records: np.ndarray) -> list[str]:
        """The stable ids of the records at (``shards[i]``, ``records[i]``)."""
        return self.provenance(shards, records).ids(self.task, self.split)

    def _refuse_packed(self) -> None:
        if self.reader.manifest.packing is not None:
            raise LedgerError(
                f"Cache {self.reader.version_dir} of task {self.task!r} holds packed rows of several examples; the "
                "ledger names one example per record. Ask it about a run over the task's unpacked cache.")

    def byte_lengths(self, shards: np.ndarray, records: np.ndarray) -> np.ndarray:
        """The framed size in bytes of each record (what a reader transfers for it)."""
        shards = np.asarray(shards, np.int64)
        records = np.asarray(records, np.int64)
        if self._byte_ranges is not None:
            return self._byte_ranges(shards, records, np.ones_like(records))[1]
        out = np.empty(len(shards), np.int64)
        with self._lock:
            for shard in np.unique(shards).tolist():
                mine = np.flatnonzero(shards == shard)
                offsets = self.reader.shard_offsets(self.split, shard)
                out[mine] = offsets[records[mine] + 1] - offsets[records[mine]]
        return out

    def stats(self) -> dict[str, Any]:
        """The version's ``stats.{split}.json`` (examples, tokens per feature, length histograms)."""
        if self._stats is None:
            path = fs.join(self.reader.version_dir, f"stats.{self.split}.json")
            self._stats = json.loads(fs.read_bytes(path))
        return self._stats

    def find(self, example_id: str) -> tuple[int, int]:
        """(cache shard, record) of the example with stable id ``example_id``: a search by shuffle key."""
        try:
            task, split, source_shard, ordinal = parse_example_id(example_id)
        except ValueError as error:
            raise LedgerError(str(error)) from None
        if (task, split) != (self.task, self.split):
            raise LedgerError(
                f"Example {example_id!r} is of task {task!r}, split {split!r}; this cache is task {self.task!r}, "
                f"split {self.split!r}."
            )
        self._refuse_packed()
        key = shuffle_key(self.seed, task, split, source_shard, ordinal)
        num_shards = len(self.record_counts)
        shard = shard_of_key(key, num_shards)
        count = self.record_counts[shard]
        # Records [low, high) hold keys in [low_key, high_key): the shard's key range to begin with.
        low, high = 0, count
        low_key, high_key = -(-(shard << 64) // num_shards), -(-((shard + 1) << 64) // num_shards)
        probes = 0
        with self._lock:
            while low < high:  # the first record whose key is not below ``key``
                if probes % 3 == 2:
                    guess = (low + high) // 2
                else:
                    guess = low + (key - low_key) * (high - low) // max(1, high_key - low_key)
                    guess = min(max(guess, low), high - 1)
                probes += 1
                found_key = self._key(shard, guess)
                if found_key < key:
                    low, low_key = guess + 1, found_key + 1
                else:
                    high, high_key = guess, found_key
            found = low < count and self._key(shard, low) == key
        if not found:
            raise LedgerError(
                f"The cache of task {self.task!r} holds no example {example_id!r}: its shuffle key would put it in "
                f"shard {shard} ({self.record_counts[shard]} records), which does not hold it. Source shard "
                f"{source_shard} made fewer than {ordinal + 1} examples, or the id is of another cache version."
            )
        return shard, low

    def _key(self, shard: int, record: int) -> int:
        if self._has_origins:
            source_shard, ordinal = self._origins(shard).rows(np.array([record]))[0, :2].tolist()
            return shuffle_key(self.seed, self.task, self.split, source_shard, ordinal)
        # One record: the generic parser, reading the provenance features only, is ~30x cheaper than a batch decode.
        record_bytes = self.reader.read(self.split, shard, record, 1)[0]
        example = decode_example(record_bytes, tuple(self._spec))
        decoded = {name: _one_row(example[name]) for name in self._spec if name in example}
        found = read_provenance(self.reader.manifest, self.split, decoded)
        return shuffle_key(self.seed, self.task, self.split, int(found.source_shard[0]), int(found.ordinal[0]))

    def close(self) -> None:
        with self._lock:
            self.reader.close()


def _one_row(values: Any) -> RaggedFeature:
    """One record's values of a feature (``decode_example``'s) as the batch decoder gives them."""
    return RaggedFeature(values, np.array([0, len(values)], np.int64))


def open_views(plan: RunPlan, cache_root: str) -> dict[str, TaskCacheView]:
    """A view of every task's pinned cache version under ``cache_root`` (found by manifest sha256)."""
    views: dict[str, TaskCacheView] = {}
    try:
        for task in plan.task_names:
            views[task] = TaskCacheView.open(cache_root, task, plan.caches[task].fingerprint, plan.split)
    except BaseException:
        for view in views.values():
            view.close()
        raise
    return views


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One example of a step: where it is in the stream and the cache, and what it was made from."""

    position: int
    data_shard: int
    task: str
    epoch: int
    index: int  # in the task's cache order
    shard: int
    record: int
    id: str
    source_file: str | None
    documents: tuple[int, int] | None  # first and last source document it was made from

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["documents"] = None if self.documents is None else list(self.documents)
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class StepLedgerColumns:
    """The examples of a step, as columns of one entry per example in batch order (what ``LedgerEntry`` holds).

    ``tasks`` indexes ``task_names``; a document range is ``-1, -1`` where the cache does not record it.
    """

    task_names: tuple[str, ...]
    split: str
    positions: np.ndarray
    data_shards: np.ndarray
    tasks: np.ndarray
    epochs: np.ndarray
    indices: np.ndarray
    shards: np.ndarray
    records: np.ndarray
    source_shards: np.ndarray
    ordinals: np.ndarray
    source_files: np.ndarray  # object: str
    first_documents: np.ndarray
    last_documents: np.ndarray

    def __len__(self) -> int:
        return len(self.positions)

    def rows(self) -> list[tuple[Any, ...]]:
        """Each example's (position, data shard, task, epoch, index, shard, record, id, source file, documents)."""
        names = np.asarray(self.task_names, dtype=object)[self.tasks].tolist()
        split = self.split
        ids = [format_example_id(task, split, s, o) for task, s, o in
               zip(names, self.source_shards.tolist(), self.ordinals.tolist(), strict=True)]
        documents = [None if first < 0 else (first, last) for first, last in
                     zip(self.first_documents.tolist(), self.last_documents.tolist(), strict=True)]
        return list(zip(self.positions.tolist(), self.data_shards.tolist(), names, self.epochs.tolist(),
                        self.indices.tolist(), self.shards.tolist(), self.records.tolist(), ids,
                        self.source_files.tolist(), documents, strict=True))

    def dicts(self) -> list[dict[str, Any]]:
        """Each example as its entry's JSON object (``LedgerEntry.to_dict``), made straight from the columns: once
        the provenance comes from sidecars, making 2,048 of them is most of what a JSON answer costs."""
        names = np.asarray(self.task_names, dtype=object)[self.tasks].tolist()
        split = self.split
        columns = (self.positions, self.data_shards, self.epochs, self.indices, self.shards, self.records,
                   self.source_shards, self.ordinals, self.source_files, self.first_documents, self.last_documents)
        return [
            {"position": position, "data_shard": data_shard, "task": task, "epoch": epoch, "index": index,
             "shard": shard, "record": record, "id": format_example_id(task, split, source_shard, ordinal),
             "source_file": source_file, "documents": None if first < 0 else [first, last]}
            for task, position, data_shard, epoch, index, shard, record, source_shard, ordinal, source_file, first, last
            in zip(names, *(column.tolist() for column in columns), strict=True)
        ]


@dataclasses.dataclass(frozen=True, eq=False)
class StepLedger:
    """The examples of ``step`` (of one data shard's slice, or of the whole global batch), in order.

    A skipped step delivers nothing; its entries are the examples its positions hold, never delivered.
    ``columns`` holds them as arrays; ``entries`` (made on first use) as one ``LedgerEntry`` each. Ledgers
    compare by identity: compare their ``entries`` (or ``to_dict()``) to compare contents.
    """

    run: str
    fingerprint: str
    step: int
    skipped: bool
    stage: int
    global_batch_size: int
    data_shard: int | None
    num_data_shards: int
    positions: range
    columns: StepLedgerColumns = dataclasses.field(repr=False)

    @functools.cached_property
    def entries(self) -> tuple[LedgerEntry, ...]:
        return tuple(LedgerEntry(*row) for row in self.columns.rows())

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "fingerprint": self.fingerprint,
            "step": self.step,
            "skipped": self.skipped,
            "stage": self.stage,
            "global_batch_size": self.global_batch_size,
            "data_shard": self.data_shard,
            "num_data_shards": self.num_data_shards,
            "positions": {"start": self.positions.start, "stop": self.positions.stop},
            "examples": self.columns.dicts(),
        }


def step_ledger(
    plan: RunPlan,
    views: Mapping[str, TaskCacheView],
    step: int,
    *,
    host: int | None = None,
    num_hosts: int | None = None,
) -> StepLedger:
    """Every example of ``step``, or of host ``host`` of ``num_hosts``: the slice ``/shards`` hands that host
    (``host_slice_for``: ``num_hosts`` a multiple or a divisor of ``num_data_shards``), whose ``data_shard``
    is the first data shard of the slice."""
    if (host is None) != (num_hosts is None):
        raise LedgerError("Give both host and num_hosts (a host's slice), or neither (the whole global batch).")
    try:
        if host is None:
            data_shard, positions = None, plan.positions(step)
        else:
            assert num_hosts is not None
            index, count = host_slice_for(host, num_hosts, plan.num_data_shards)
            data_shard = index * (plan.num_data_shards // count)
            positions = slice_positions(plan, step, index, count)
    except PlanError as error:
        raise LedgerError(f"Run {plan.name!r}: {error}") from None
    per_shard = plan.batch_size(step) // plan.num_data_shards
    return StepLedger(
        run=plan.name,
        fingerprint=plan.fingerprint_before(step + 1),
        step=step,
        skipped=plan.is_skipped(step),
        stage=plan.stage_at(step),
        global_batch_size=plan.batch_size(step),
        data_shard=data_shard,
        num_data_shards=plan.num_data_shards,
        positions=positions,
        columns=_columns(plan, views, positions, plan.first_position(step), per_shard),
    )


def _columns(plan: RunPlan, views: Mapping[str, TaskCacheView], positions: range, step_start: int,
             per_shard: int) -> StepLedgerColumns:
    """The ledger's columns: the index math as arrays, then each task's provenance in one read and decode."""
    if fits_int64(plan, positions):
        arrays = example_arrays(plan, positions)
        tasks, epochs, indices, shards, records = arrays.tasks, arrays.epochs, arrays.indices, arrays.shards, arrays.records
        position = np.arange(positions.start, positions.stop, dtype=np.int64)
        data_shards = (position - step_start) // per_shard
    else:  # beyond int64 (positions past 2**63, or as many records): the exact scalar chain, in Python ints
        refs = examples_at(plan, positions)
        numbers = {name: i for i, name in enumerate(plan.task_names)}
        tasks = np.array([numbers[e.task] for e in refs], np.int64)
        epochs, indices = (np.array([getattr(e, f) for e in refs], object) for f in ("epoch", "index"))
        shards, records = (np.array([getattr(e, f) for e in refs], np.int64) for f in ("shard", "record"))
        position = np.array(list(positions), object)
        data_shards = np.array([(p - step_start) // per_shard for p in positions], np.int64)
    n = len(tasks)
    source_shards, ordinals = np.empty(n, np.int64), np.empty(n, np.int64)
    first, last = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    files = np.empty(n, object)
    for task in np.unique(tasks).tolist():
        mine = np.flatnonzero(tasks == task)
        found = views[plan.task_names[task]].provenance(shards[mine], records[mine])
        source_shards[mine], ordinals[mine], files[mine] = found.source_shard, found.ordinal, found.source_file
        if found.first_document is not None and found.last_document is not None:
            first[mine], last[mine] = found.first_document, found.last_document
    return StepLedgerColumns(
        task_names=tuple(plan.task_names), split=plan.split, positions=position, data_shards=data_shards,
        tasks=tasks, epochs=epochs, indices=indices, shards=shards, records=records, source_shards=source_shards,
        ordinals=ordinals, source_files=files, first_documents=first, last_documents=last,
    )


@dataclasses.dataclass(frozen=True)
class ExampleLedger:
    """Where the run reads one example: its place in the cache, and its reads from ``from_step`` on.

    ``reads`` lists at most ``limit`` of them (``truncated`` says whether there are more before
    ``until_step``). With ``until_step``, ``total`` is how many reads fall in ``[from_step, until_step)``
    and ``skipped`` how many of those are in skipped steps (never delivered).
    """

    run: str
    fingerprint: str
    id: str
    task: str
    shard: int
    record: int
    index: int
    from_step: int
    until_step: int | None
    total: int | None
    skipped: int | None
    reads: tuple[Occurrence, ...]
    truncated: bool

    def to_dict(self) -> dict[str, Any]:
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        out["reads"] = [read.to_dict() for read in self.reads]
        return out


def example_ledger(
    plan: RunPlan,
    views: Mapping[str, TaskCacheView],
    example_id: str,
    *,
    from_step: int = 0,
    until_step: int | None = None,
    limit: int = 100,
) -> ExampleLedger:
    """The reads of the example ``example_id`` (``task/split/source shard/ordinal``) by run ``plan``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise LedgerError(f"limit must be an integer >= 0 but got {limit!r}.")
    try:
        task = parse_example_id(example_id)[0]
    except ValueError as error:
        raise LedgerError(str(error)) from None
    if task not in plan.caches:
        raise LedgerError(
            f"Example {example_id!r} is of task {task!r}, which run {plan.name!r} does not read; its tasks are "
            f"{list(plan.task_names)}."
        )
    shard, record = views[task].find(example_id)
    index = plan.layouts[plan.task_index(task)].index_of(shard, record)
    try:
        # One more than asked for says whether there are more.
        reads = occurrences(plan, task, index, from_step=from_step, until_step=until_step, limit=limit + 1)
    except PlanError as error:
        raise LedgerError(str(error)) from None
    truncated = len(reads) > limit
    reads = reads[:limit]
    total = skipped = None
    if until_step is not None:
        total = reads_before(plan, task, index, until_step) - reads_before(plan, task, index, from_step)
        skipped = 0
        for skip in plan.skip:
            a, b = max(skip.start, from_step), min(skip.stop, until_step)
            if a < b:
                skipped += reads_before(plan, task, index, b) - reads_before(plan, task, index, a)
    return ExampleLedger(
        run=plan.name,
        fingerprint=plan.fingerprint() if until_step is None else plan.fingerprint_before(until_step),
        id=example_id,
        task=task,
        shard=shard,
        record=record,
        index=index,
        from_step=from_step,
        until_step=until_step,
        total=total,
        skipped=skipped,
        reads=reads,
        truncated=truncated,
    )

