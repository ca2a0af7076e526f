"""Step instructions -> this host's numpy batch: verified reads, the interleave order, padding.

Shard URIs name files inside a cache version folder; a ``CacheReader`` is opened per folder on first
use, and only if that folder holds the exact bytes the run's plan pins (its manifest sha256). Every
read is checked three ways: each file's URI is that reader's own path for the shard, the byte ranges
are the ones its verified offsets sidecars give, and each record's CRCs match
(``CacheReader.read_records``).

A packed cache's record is one row of several examples (``taskdata.example.packing``): it is read as one
example, and for every packed feature the reader also passes its ``_segment_ids`` and ``_positions``
through, padded to the same length, as t5x's packed models take them. One run's caches are all packed
(with the same features) or all unpacked: a batch cannot mix rows with examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from taskdata.cache.reader import CacheReader
from taskdata.example import decode_batch, decode_padded, pad_features
from taskdata.example.packing import positions_name, segment_ids_name
from taskdata.example.padded import Allocate
from taskdata.index import StepReads, TaskReads
from trainer_client.assignments import AssignmentError, RunInfo
from trainer_client.shard_table import CacheReaderTable

__all__ = ["BatchReader", "ClientBatch"]


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


class BatchReader:
    """Reads the records a ``StepReads`` names. Not thread-safe: one reading thread owns it."""

    def __init__(self, info: RunInfo, lengths: Mapping[str, int], *, verify_crc: bool = True):
        if not lengths:
            raise ValueError("lengths must name at least one feature, e.g. {'inputs': 512, 'targets': 114}.")
        for name, length in lengths.items():
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise ValueError(f"Length of feature {name!r} must be a positive integer but got {length!r}.")
        self.info = info
        self.lengths = dict(lengths)
        self.verify_crc = verify_crc
        self._readers: dict[str, tuple[CacheReader, CacheReaderTable]] = {}
        self._packed: tuple[str, ...] | None = None  # the packed features of the run's caches, once one is open

    def read(self, step_reads: StepReads, into: Allocate | None = None) -> ClientBatch:
        """The step's batch; with ``into``, each feature's array is one ``into`` gave (called with the
        feature's name, rows and length, once or more: a name asked again wants the same array)."""
        if step_reads.skipped:
            return ClientBatch(step_reads.step, True, step_reads.global_batch_size, step_reads.positions, {})
        per_task = [self._spans(step_reads.step, t, task) for t, task in enumerate(step_reads.tasks)]
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

    def _spans(self, step: int, task_index: int, task: TaskReads) -> tuple[bytes, np.ndarray, np.ndarray]:
        """The records of ``task``'s reads, in order (one buffer and their spans in it), after checking
        every file and byte range."""
        if not len(task):
            return b"", np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        found = [
            self._reader_for(task_index, uri, shard)
            for shard, uri in zip(task.files.tolist(), task.file_uris, strict=True)
        ]
        reader, table = found[-1]  # every one holds the bytes the plan pins
        try:
            starts, lengths = table.byte_ranges(task.shard, task.first_record, task.count)
        except IndexError as error:
            raise AssignmentError(
                f"Step {step}: {error} The instructions were made for other bytes."
            ) from None
        wrong = np.flatnonzero((starts != task.byte_offset) | (lengths != task.byte_length))
        if len(wrong):
            i = int(wrong[0])
            first, count, shard = int(task.first_record[i]), int(task.count[i]), int(task.shard[i])
            raise AssignmentError(
                f"Step {step}: the instructions say records {first}..{first + count - 1} of "
                f"{table.shard_uris[shard]} are bytes {int(task.byte_offset[i])}+{int(task.byte_length[i])}, "
                f"but the shard's verified offsets give {int(starts[i])}+{int(lengths[i])}. The instructions "
                "were made for other bytes; do not train on them."
            )
        shards, records = task.records()
        return reader.read_spans(self.info.split, shards, records)

    def _reader_for(self, task_index: int, uri: str, shard: int) -> tuple[CacheReader, CacheReaderTable]:
        task = self.info.plan.task_names[task_index]
        version_dir = uri.rsplit("/", 1)[0]
        found = self._readers.get(version_dir)
        if found is None:
            # Refuses a folder whose manifest is not the one the plan pins for this task.
            reader = CacheReader(
                version_dir,
                verify_crc=self.verify_crc,
                expected_manifest_sha256=self.info.plan.caches[task].fingerprint,
            )
            packed = reader.manifest.packed_features
            if self._packed is not None and packed != self._packed:
                raise AssignmentError(
                    f"Task {task!r}'s cache {version_dir} is {'packed (' + ', '.join(packed) + ')' if packed else 'not packed'}"
                    f", but this run's other caches are {'packed (' + ', '.join(self._packed) + ')' if self._packed else 'not'}"
                    ": a batch cannot mix packed rows with examples. Cache every task of the run the same way "
                    "('taskdata cache --pack', or none).")
            self._packed = packed
            found = self._readers[version_dir] = (reader, CacheReaderTable(reader, self.info.split))
        reader, table = found
        if reader.task != task or not 0 <= shard < len(table.shard_uris) or table.shard_uris[shard] != uri:
            theirs = table.shard_uris[shard] if 0 <= shard < len(table.shard_uris) else "no such shard"
            raise AssignmentError(
                f"Instructions name {uri} as shard {shard} of task {task!r}, but that version folder holds "
                f"task {reader.task!r} whose shard {shard} is {theirs}."
            )
        return found

    def close(self) -> None:
        for reader, _ in self._readers.values():
            reader.close()
        self._readers.clear()


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
