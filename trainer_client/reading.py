"""Step instructions -> this host's numpy batch: verified reads, the server's interleave order, padding.

Shard URIs name files inside a cache version folder; a ``CacheReader`` is opened per folder on first
use, and only if that folder holds the exact bytes the run's plan pins (its manifest sha256). Every
read is checked three ways: the URI is that reader's own path for the shard, the byte range is the one
its verified offsets sidecar gives, and each record's CRCs match (``CacheReader.read_records``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from taskdata.cache.reader import CacheReader
from taskdata.stream import pad_features
from trainer_client.assignments import AssignmentError, RunInfo, StepReads

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
        """Non-padding tokens (0 is PAD)."""
        return int(sum(np.count_nonzero(array) for array in self.features.values()))


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
        self._spec = {name: "int32" for name in self.lengths}
        self._verify_crc = verify_crc
        self._readers: dict[str, CacheReader] = {}

    def read(self, step_reads: StepReads) -> ClientBatch:
        if step_reads.skipped:
            return ClientBatch(step_reads.step, True, step_reads.global_batch_size, step_reads.positions, {})
        per_task: list[list[bytes]] = []
        for task_index, task in enumerate(step_reads.tasks):
            shards: list[np.ndarray] = []
            records: list[np.ndarray] = []
            reader = None
            for read in task.reads:
                reader = self._reader_for(task_index, read.uri, read.shard)
                offsets = reader.shard_offsets(self.info.split, read.shard)
                start = int(offsets[read.first_record])
                length = int(offsets[read.first_record + read.count]) - start
                if (start, length) != (read.byte_offset, read.byte_length):
                    raise AssignmentError(
                        f"Step {step_reads.step}: the instructions say records {read.first_record}.."
                        f"{read.first_record + read.count - 1} of {read.uri} are bytes {read.byte_offset}+"
                        f"{read.byte_length}, but the shard's verified offsets give {start}+{length}. The "
                        "instructions were made for other bytes; do not train on them."
                    )
                shards.append(np.full(read.count, read.shard, dtype=np.int64))
                records.append(np.arange(read.first_record, read.first_record + read.count, dtype=np.int64))
            if reader is None:
                per_task.append([])
                continue
            per_task.append(
                reader.read_records(self.info.split, np.concatenate(shards), np.concatenate(records))
            )
        ordered = _interleave(per_task, step_reads.order)
        decoded = next(iter(self._readers.values())).decode(ordered, self._spec)
        try:
            features = pad_features(decoded, self.lengths)
        except ValueError as error:
            raise ValueError(
                f"Step {step_reads.step}: {error} Raise that feature's length (the trainer's sequence length) "
                "to at least the cache's longest example."
            ) from None
        return ClientBatch(
            step_reads.step, False, step_reads.global_batch_size, step_reads.positions, features
        )

    def _reader_for(self, task_index: int, uri: str, shard: int) -> CacheReader:
        task = self.info.plan.task_names[task_index]
        version_dir = uri.rsplit("/", 1)[0]
        reader = self._readers.get(version_dir)
        if reader is None:
            # Refuses a folder whose manifest is not the one the plan pins for this task.
            reader = CacheReader(
                version_dir,
                verify_crc=self._verify_crc,
                expected_manifest_sha256=self.info.plan.caches[task].fingerprint,
            )
            self._readers[version_dir] = reader
        if reader.task != task or reader.shard_path(self.info.split, shard) != uri:
            raise AssignmentError(
                f"Instructions name {uri} as shard {shard} of task {task!r}, but that version folder holds "
                f"task {reader.task!r} whose shard {shard} is {reader.shard_path(self.info.split, shard)}."
            )
        return reader

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


def _interleave(per_task: Sequence[list[bytes]], order: Sequence[int]) -> list[bytes]:
    """Records in batch order: example i is the next unused record of task ``order[i]``."""
    cursors = [0] * len(per_task)
    out = []
    for task_index in order:
        out.append(per_task[task_index][cursors[task_index]])
        cursors[task_index] += 1
    return out
