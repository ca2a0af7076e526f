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
from taskdata.example import pad_features
from taskdata.example.packing import positions_name, segment_ids_name
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
        self._verify_crc = verify_crc
        self._readers: dict[str, tuple[CacheReader, CacheReaderTable]] = {}
        self._packed: tuple[str, ...] | None = None  # the packed features of the run's caches, once one is open

    def read(self, step_reads: StepReads) -> ClientBatch:
        if step_reads.skipped:
            return ClientBatch(step_reads.step, True, step_reads.global_batch_size, step_reads.positions, {})
        per_task = [self._records(step_reads.step, t, task) for t, task in enumerate(step_reads.tasks)]
        ordered = _interleave(per_task, step_reads.order)
        lengths = self._lengths_with_packing()
        decoded = next(iter(self._readers.values()))[0].decode(ordered, {name: "int32" for name in lengths})
        try:
            features = pad_features(decoded, lengths)
        except ValueError as error:
            raise ValueError(
                f"Step {step_reads.step}: {error} Raise that feature's length (the trainer's sequence length) "
                "to at least the cache's longest example."
            ) from None
        return ClientBatch(
            step_reads.step, False, step_reads.global_batch_size, step_reads.positions, features
        )

    def _lengths_with_packing(self) -> dict[str, int]:
        """The trainer's lengths, plus the segment ids and positions of every packed feature it reads."""
        lengths = dict(self.lengths)
        for name, length in self.lengths.items():
            if name in (self._packed or ()):
                lengths[segment_ids_name(name)] = lengths[positions_name(name)] = length
        return lengths

    def _records(self, step: int, task_index: int, task: TaskReads) -> list[bytes]:
        """The records of ``task``'s reads, in order, after checking every file and byte range."""
        if not len(task):
            return []
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
        return reader.read_records(self.info.split, shards, records)

    def _reader_for(self, task_index: int, uri: str, shard: int) -> tuple[CacheReader, CacheReaderTable]:
        task = self.info.plan.task_names[task_index]
        version_dir = uri.rsplit("/", 1)[0]
        found = self._readers.get(version_dir)
        if found is None:
            # Refuses a folder whose manifest is not the one the plan pins for this task.
            reader = CacheReader(
                version_dir,
                verify_crc=self._verify_crc,
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


def _interleave(per_task: Sequence[list[bytes]], order: np.ndarray) -> list[bytes]:
    """Records in batch order: example i is the next unused record of task ``order[i]``."""
    cursors = [0] * len(per_task)
    out = []
    for task_index in order.tolist():
        out.append(per_task[task_index][cursors[task_index]])
        cursors[task_index] += 1
    return out
