"""Step instructions -> this host's numpy batch: verified reads, the interleave order, padding.

Shard URIs name files inside a cache version folder; a ``CacheReader`` is opened per folder on first
use (or taken from the instruction source, ``readers``, so that each sidecar is read once per process),
and only if that folder holds the exact bytes the run's plan pins (its manifest sha256). Every read is
checked three ways: each file's URI is that reader's own path for the shard, the byte ranges are the
ones its verified offsets sidecars give, and each record's CRCs match (``CacheReader.read_records``).

Reading a step is two calls: ``start`` checks the instructions and starts the step's reads (remote
shards: ranged requests in flight through the reader's ``RangeFetcher``, at most
``FetchOptions.max_in_flight`` at once), ``finish`` waits for them, verifies and decodes. A caller
that starts several steps before finishing the first keeps their reads in flight together
(``DataIterator`` does, within its read-ahead); ``read`` is both at once.

A packed cache's record is one row of several examples (``taskdata.example.packing``): it is read as one
example, and for every packed feature the reader also passes its ``_segment_ids`` and ``_positions``
through, padded to the same length, as t5x's packed models take them. One run's caches are all packed
(with the same features) or all unpacked: a batch cannot mix rows with examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from taskdata import fs
from taskdata.cache.ranges import FetchOptions, RangeFetcher
from taskdata.cache.reader import CacheReader, PendingSpans
from taskdata.example import decode_batch, decode_padded, pad_features
from taskdata.example.packing import positions_name, segment_ids_name
from taskdata.example.padded import Allocate
from taskdata.index import StepReads, TaskReads
from trainer_client.assignments import AssignmentError, RunInfo
from trainer_client.shard_table import CacheReaderTable

__all__ = ["BatchReader", "ClientBatch", "PendingBatch"]


@dataclasses.dataclass(frozen=True)
class ClientBatch:
    """One host's examples of one step: zero-padded int32 arrays [examples, length] per feature.

    A skipped step (the plan skips its data) has no features; the trainer skips it.
    """

    step: int
    skipped: bool
    global_batch_size: int
    positions: range
    features: Mapping[str, np.ndarray]

    @property
    def num_tokens(self) -> int:
        """Non-padding tokens (0 is PAD) of the token features (not of a packed row's segment ids or positions)."""
        return int(sum(np.count_nonzero(array) for name, array in self.features.items()
                       if not name.endswith(("_segment_ids", "_positions"))))


@dataclasses.dataclass(frozen=True, eq=False)
class PendingBatch:
    """A step whose reads ``BatchReader.start`` has started: each task's records on their way."""

    step_reads: StepReads
    spans: tuple[PendingSpans | None, ...]  # per task of the plan; None for a task the step does not read

    def cancel(self) -> None:
        for spans in self.spans:
            if spans is not None:
                spans.cancel()


class BatchReader:
    """Reads the records a ``StepReads`` names. Not thread-safe: one reading thread owns it.

    Args:
      info: the run.
      lengths: padded length of every feature to deliver.
      verify_crc: check both CRCs of every record (framing and the sidecar's CRCs are always checked).
      readers: cache readers of the run's version folders, by folder, to read with instead of opening
        new ones (``LocalAssignments.readers``); the caller closes them.
      fetch: how remote shards are read (requests in flight, coalescing, timeouts, retries).
    """

    def __init__(self, info: RunInfo, lengths: Mapping[str, int], *, verify_crc: bool = True,
                 readers: Mapping[str, CacheReader] | None = None, fetch: FetchOptions | None = None):
        if not lengths:
            raise ValueError("lengths must name at least one feature, e.g. {'inputs': 512, 'targets': 114}.")
        for name, length in lengths.items():
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise ValueError(f"Length of feature {name!r} must be a positive integer but got {length!r}.")
        self.info = info
        self.lengths = dict(lengths)
        self.verify_crc = verify_crc
        self._readers: dict[str, tuple[CacheReader, CacheReaderTable]] = {}
        self._given = dict(readers or {})
        self._fetcher = RangeFetcher(fetch)
        self._packed: tuple[str, ...] | None = None  # the packed features of the run's caches, once one is open

    def read(self, step_reads: StepReads, into: Allocate | None = None) -> ClientBatch:
        """The step's batch; with ``into``, each feature's array is one ``into`` gave (called with the
        feature's name, rows and length, once or more: a name asked again wants the same array)."""
        return self.finish(self.start(step_reads), into)

    def open(self, steps: Sequence[StepReads]) -> None:
        """Loads the offsets sidecars of every shard ``steps`` read that is not loaded yet, all at once (of
        remote shards: one round trip per cache version), so that starting them waits for none."""
        wanted: dict[str, tuple[CacheReader, set[int]]] = {}
        for step_reads in steps:
            for t, task in enumerate(step_reads.tasks):
                if not len(task):
                    continue
                reader, _ = self._reader_for(t, _version_dir(task))
                if not reader.offsets_loaded(self.info.split):
                    wanted.setdefault(reader.version_dir, (reader, set()))[1].update(task.files.tolist())
        for reader, shards in wanted.values():
            reader.load_offsets(self.info.split, shards)

    def announce(self, step_reads: StepReads) -> None:
        """Says that ``step_reads`` will be started later: the requests of the steps started before it may take
        in its reads of remote shards (``RangeFetcher.announce``), so that it finds them read."""
        paths: list[str] = []
        begins, lengths, files = [], [], []
        for task in step_reads.tasks:
            if not len(task) or not fs.is_remote(task.file_uris[0]):
                continue
            files.append(np.searchsorted(task.files, task.shard) + len(paths))
            paths.extend(task.file_uris)
            begins.append(task.byte_offset)
            lengths.append(task.byte_length)
        if paths:
            self._fetcher.announce(step_reads.step, paths, np.concatenate(begins), np.concatenate(lengths),
                                   np.concatenate(files))

    def forget_announced(self) -> None:
        """Forgets every step announced and not started (a reader that moves to another step)."""
        self._fetcher.withdraw()

    def start(self, step_reads: StepReads) -> PendingBatch:
        """Checks the step's instructions against the verified sidecars and starts its reads (each request of a
        remote shard taking in the reads of the steps announced for later that chain onto it)."""
        if step_reads.skipped:
            return PendingBatch(step_reads, ())
        self._fetcher.withdraw(step_reads.step)
        spans = tuple(self._start_spans(step_reads.step, t, task) for t, task in enumerate(step_reads.tasks))
        return PendingBatch(step_reads, spans)

    def finish(self, pending: PendingBatch, into: Allocate | None = None) -> ClientBatch:
        """The batch of a started step (see ``read``)."""
        step_reads = pending.step_reads
        if step_reads.skipped:
            return ClientBatch(step_reads.step, True, step_reads.global_batch_size, step_reads.positions, {})
        per_task = [_EMPTY if spans is None else spans.result() for spans in pending.spans]
        buffer, starts, ends = _interleave(step_reads.step, per_task, step_reads.order)
        lengths = self._lengths_with_packing()
        features = decode_padded(buffer, starts, ends, lengths, into)
        if features is None:
            features = self._decode_generic(step_reads.step, buffer, starts, ends, lengths)
            if into is not None:
                features = _copied_into(features, into)
        return ClientBatch(
            step_reads.step, False, step_reads.global_batch_size, step_reads.positions, features
        )

    def _decode_generic(
        self, step: int, buffer: bytes, starts: np.ndarray, ends: np.ndarray, lengths: Mapping[str, int]
    ) -> dict[str, np.ndarray]:
        """What ``decode_padded`` leaves to the generic decoder: it decodes the records or says precisely
        what is wrong with them."""
        records = [buffer[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        decoded = decode_batch(records, {name: "int32" for name in lengths})
        try:
            return pad_features(decoded, lengths)
        except ValueError as error:
            raise ValueError(
                f"Step {step}: {error} Raise that feature's length (the trainer's sequence length) "
                "to at least the cache's longest example."
            ) from None

    def _lengths_with_packing(self) -> dict[str, int]:
        """The trainer's lengths, plus the segment ids and positions of every packed feature it reads."""
        lengths = dict(self.lengths)
        for name, length in self.lengths.items():
            if name in (self._packed or ()):
                lengths[segment_ids_name(name)] = lengths[positions_name(name)] = length
        return lengths

    def _start_spans(self, step: int, task_index: int, task: TaskReads) -> PendingSpans | None:
        """Starts reading the records of ``task``'s reads, in order, after checking every file and byte
        range (None when there are none)."""
        if not len(task):
            return None
        reader, table = self._reader_for(task_index, _version_dir(task))  # it holds the bytes the plan pins
        for shard, uri in zip(task.files.tolist(), task.file_uris, strict=True):
            if not 0 <= shard < len(table.shard_uris) or table.shard_uris[shard] != uri:
                theirs = table.shard_uris[shard] if 0 <= shard < len(table.shard_uris) else "no such shard"
                raise AssignmentError(
                    f"Instructions name {uri} as shard {shard} of task {reader.task!r}, but its version folder "
                    f"{reader.version_dir} holds as shard {shard} {theirs}."
                )
        shards, records = task.records()
        try:
            pending = reader.start_spans(self.info.split, shards, records, self._fetcher)
        except IndexError as error:
            raise AssignmentError(f"Step {step}: {error} The instructions were made for other bytes.") from None
        # Each read's byte range, as the verified sidecars place its records, must be the instructions' own.
        starts, ends = pending.frames()
        firsts = np.cumsum(task.count) - task.count
        begins, lengths = starts[firsts], ends[firsts + task.count - 1] - starts[firsts]
        wrong = np.flatnonzero((begins != task.byte_offset) | (lengths != task.byte_length))
        if len(wrong):
            pending.cancel()
            i = int(wrong[0])
            first, count, shard = int(task.first_record[i]), int(task.count[i]), int(task.shard[i])
            raise AssignmentError(
                f"Step {step}: the instructions say records {first}..{first + count - 1} of "
                f"{table.shard_uris[shard]} are bytes {int(task.byte_offset[i])}+{int(task.byte_length[i])}, "
                f"but the shard's verified offsets give {int(begins[i])}+{int(lengths[i])}. The instructions "
                "were made for other bytes; do not train on them."
            )
        return pending

    def _reader_for(self, task_index: int, version_dir: str) -> tuple[CacheReader, CacheReaderTable]:
        """The reader of ``version_dir``, checking that it holds task ``task_index``'s cache."""
        task = self.info.plan.task_names[task_index]
        found = self._readers.get(version_dir)
        if found is None:
            expected = self.info.plan.caches[task].fingerprint
            given = self._given.get(version_dir)
            # Refuses a folder whose manifest is not the one the plan pins for this task.
            reader = given if given is not None and given.manifest_sha256 == expected and given.verify_crc == self.verify_crc else CacheReader(
                version_dir, verify_crc=self.verify_crc, expected_manifest_sha256=expected)
            packed = reader.manifest.packed_features
            if self._packed is not None and packed != self._packed:
                raise AssignmentError(
                    f"Task {task!r}'s cache {version_dir} is {'packed (' + ', '.join(packed) + ')' if packed else 'not packed'}"
                    f", but this run's other caches are {'packed (' + ', '.join(self._packed) + ')' if self._packed else 'not'}"
                    ": a batch cannot mix packed rows with examples. Cache every task of the run the same way "
                    "('taskdata cache --pack', or none).")
            self._packed = packed
            found = self._readers[version_dir] = (reader, CacheReaderTable(reader, self.info.split))
        reader = found[0]
        if reader.task != task:
            raise AssignmentError(
                f"Instructions name {version_dir} as a version folder of task {task!r}, but it holds task {reader.task!r}."
            )
        return found

    def close(self) -> None:
        for reader, _ in self._readers.values():
            if not any(reader is given for given in self._given.values()):
                reader.close()
        self._readers.clear()
        self._fetcher.close()


def _version_dir(task: TaskReads) -> str:
    """The version folder the files of ``task`` (one with reads) are named in (its first file's)."""
    return task.cache.uri(int(task.files[0])).rsplit("/", 1)[0]


_EMPTY: tuple[bytes, np.ndarray, np.ndarray] = (b"", np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def _copied_into(features: Mapping[str, np.ndarray], into: Allocate) -> dict[str, np.ndarray]:
    copies = {}
    for name, array in features.items():
        copies[name] = into(name, *array.shape)
        copies[name][...] = array
    return copies


def _interleave(
    step: int, per_task: Sequence[tuple[bytes, np.ndarray, np.ndarray]], order: np.ndarray
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The tasks' records in batch order (example i is the next unused record of task ``order[i]``):
    their buffers joined, and each example's span in the result."""
    starts = np.zeros(len(order), dtype=np.int64)
    ends = np.zeros(len(order), dtype=np.int64)
    offset = 0
    for task_index, (buffer, task_starts, task_ends) in enumerate(per_task):
        slots = np.flatnonzero(order == task_index)
        if len(slots) != len(task_starts):
            raise AssignmentError(
                f"Step {step}: the order takes {len(slots)} examples from task index {task_index}, whose reads "
                f"hold {len(task_starts)}; the instructions contradict themselves."
            )
        starts[slots] = task_starts + offset
        ends[slots] = task_ends + offset
        offset += len(buffer)
    buffer = per_task[0][0] if len(per_task) == 1 else b"".join(part for part, _, _ in per_task)
    return buffer, starts, ends
