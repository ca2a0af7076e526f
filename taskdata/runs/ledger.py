"""The ledger of a run, both ways: which examples a step read, and at which steps one example is read.

By step: the index math gives every example of the step (or of one data shard's slice) as (task,
epoch, cache shard, record), exactly what ``/shards`` hands out; reading each record's provenance
features (written by the cache job: ``taskdata.beam.pipeline.encode_cache_record``) adds its stable id
(task/split/source shard/ordinal), its source file and the range of source documents it was made from.
That costs one verified read per example.

By example: a stable id names no place in the cache, but its shuffle key (a keyed hash of the cache's
seed and the id: ``taskdata.cache.shuffle``) names the shard (a key range), and inside the shard the
records are sorted by that key. So a search finds the record, each probe reading one record's
provenance and hashing it again; no sidecar, nothing to build or keep in sync with the cache. (A keys
sidecar would save the reads, but every cache version would need it written and verified.) The keys are
a uniform hash, so the search interpolates: the key says how far into the shard's key range the record
lies, which is about how far into the shard it is. That takes ~4 one-record reads in a 100,000-record
shard (a binary search takes 17, what matters on a remote file system); every third probe bisects, so
no spread of keys costs more than about three times the binary search. From the record,
``taskdata.index.occurrences`` inverts the index math epoch by epoch: O(reads listed).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from taskdata import fs
from taskdata.cache.format import CacheFormatError, find_version, list_versions, task_dir
from taskdata.cache.reader import CacheReader
from taskdata.cache.shuffle import shard_of_key, shuffle_key
from taskdata.example import decode_example
from taskdata.index import (
    ExampleRef,
    Occurrence,
    PlanError,
    RunPlan,
    examples_at,
    host_slice_for,
    occurrences,
    reads_before,
    slice_positions,
)
from taskdata.seeding import parse_example_id

__all__ = [
    "ExampleLedger",
    "LedgerEntry",
    "LedgerError",
    "StepLedger",
    "TaskCacheView",
    "example_ledger",
    "open_views",
    "step_ledger",
]

_PROVENANCE = {
    "provenance/source_shard": "string",
    "provenance/source_shard_index": "int64",
    "provenance/index_within_shard": "int64",
    "provenance/source_first_document": "int64",
    "provenance/source_last_document": "int64",
}


_ID_FEATURES = ("provenance/source_shard_index", "provenance/index_within_shard")


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
        features = reader.manifest.features
        self._spec = {name: dtype for name, dtype in _PROVENANCE.items() if name in features}
        missing = {"provenance/source_shard_index", "provenance/index_within_shard"} - set(self._spec)
        if missing:
            raise LedgerError(
                f"Cache {reader.version_dir} of task {self.task!r} has no provenance features {sorted(missing)}: it "
                "was not built by taskdata's cache job. Rebuild it with 'taskdata cache'."
            )

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

    def provenance(self, shards: np.ndarray, records: np.ndarray) -> dict[str, list[Any]]:
        """Per record (in the order given), as columns: ``id`` (its stable id), ``source_file`` and
        ``documents`` (first and last source document; None where the cache does not record them)."""
        none = [None] * len(shards)
        if not len(shards):
            return {"id": [], "source_file": [], "documents": []}
        with self._lock:
            decoded = self.reader.decode(self.reader.read_records(self.split, shards, records), self._spec)
        # Provenance ids and document numbers are int64 features (arrays); source_shard is bytes (a list).
        column: dict[str, Any] = {name: feature.values for name, feature in decoded.items()}
        prefix = f"{self.task}/{self.split}/"
        ids = [
            f"{prefix}{source}/{ordinal}"
            for source, ordinal in zip(
                column["provenance/source_shard_index"].tolist(),
                column["provenance/index_within_shard"].tolist(),
                strict=True,
            )
        ]
        files = column.get("provenance/source_shard")
        first, last = column.get("provenance/source_first_document"), column.get("provenance/source_last_document")
        return {
            "id": ids,
            "source_file": none if files is None else [name.decode() for name in files],
            "documents": none if first is None or last is None else list(zip(first.tolist(), last.tolist(), strict=True)),
        }

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
        # One record: the generic parser, reading these two features only, is ~30x cheaper than a batch decode.
        decoded = decode_example(self.reader.read(self.split, shard, record, 1)[0], _ID_FEATURES)
        source_shard = int(decoded["provenance/source_shard_index"][0])
        ordinal = int(decoded["provenance/index_within_shard"][0])
        return shuffle_key(self.seed, self.task, self.split, source_shard, ordinal)

    def close(self) -> None:
        with self._lock:
            self.reader.close()


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


@dataclasses.dataclass(frozen=True)
class StepLedger:
    """The examples of ``step`` (of one data shard's slice, or of the whole global batch), in order.

    A skipped step delivers nothing; its entries are the examples its positions hold, never delivered.
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
    entries: tuple[LedgerEntry, ...]

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
            "examples": [entry.to_dict() for entry in self.entries],
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
    examples = examples_at(plan, positions)
    step_start = plan.first_position(step)
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
        entries=_entries(examples, views, step_start, per_shard),
    )


def _entries(
    examples: Sequence[ExampleRef], views: Mapping[str, TaskCacheView], step_start: int, per_shard: int
) -> tuple[LedgerEntry, ...]:
    tasks = np.array([e.task for e in examples], object)
    shards = np.array([e.shard for e in examples], np.int64)
    records = np.array([e.record for e in examples], np.int64)
    ids: list[Any] = [None] * len(examples)
    files, documents = list(ids), list(ids)
    for task in dict.fromkeys(tasks.tolist()):
        mine = np.flatnonzero(tasks == task).tolist()
        found = views[task].provenance(shards[mine], records[mine])
        for i, example_id, file, span in zip(mine, found["id"], found["source_file"], found["documents"], strict=True):
            ids[i], files[i], documents[i] = example_id, file, span
    return tuple(
        LedgerEntry(
            e.position, (e.position - step_start) // per_shard, e.task, e.epoch, e.index, e.shard, e.record,
            example_id, file, span,
        )
        for e, example_id, file, span in zip(examples, ids, files, documents, strict=True)
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

