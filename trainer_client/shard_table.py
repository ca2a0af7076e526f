"""``CacheReaderTable``: a cache reader as the ``taskdata.index.ShardTable`` of its task's version.

Byte ranges come from the shards' offsets sidecars, each loaded (and checked against the manifest) on
first use, so a host loads the sidecars of the shards it reads only; those a call needs are loaded together.
The offsets of the shards loaded so far are also kept end to end in one array, as the server's
``ResolvedCache`` keeps all of them, so that a step's reads are looked up in a few array operations
whatever the number of shards they touch (8 more bytes per record loaded, beside the reader's 12).
``LocalAssignments`` computes read instructions with it; ``BatchReader`` checks the files instructions name
against its ``shard_uris`` (and their byte ranges against the frames its ``CacheReader`` locates).
"""

from __future__ import annotations

import threading

import numpy as np

from taskdata.cache.reader import CacheReader
from taskdata.cache.tfrecord import flat_byte_ranges

__all__ = ["CacheReaderTable"]


class CacheReaderTable:
    """The shard files and record byte ranges of ``reader``'s split ``split``."""

    def __init__(self, reader: CacheReader, split: str):
        self._reader = reader
        self._split = split
        self.task = reader.task
        self.version = reader.version_dir.rsplit("/", 1)[-1]
        self._records = np.asarray(reader.record_counts(split), np.int64)  # per shard
        self.shard_uris = tuple(reader.shard_path(split, s) for s in range(len(self._records)))
        # Where each loaded shard's offsets start in _flat (-1: not loaded yet); _flat grows by doubling.
        self._starts = np.full(len(self._records), -1, np.int64)
        self._flat = np.empty(0, np.int64)
        self._used = 0
        self._lock = threading.Lock()  # the arrays are swapped while shards are added

    def byte_ranges(
        self, shards: np.ndarray, first_records: np.ndarray, counts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(byte offsets, byte lengths) of the reads; IndexError names a read outside its shard."""
        shards, first_records, counts = (np.asarray(a, np.int64) for a in (shards, first_records, counts))
        ends = first_records + counts
        if len(shards):
            if int(shards.min()) < 0 or int(shards.max()) >= len(self._records):
                bad = int(shards[(shards < 0) | (shards >= len(self._records))][0])
                raise IndexError(
                    f"Shard {bad} of task {self.task!r} does not exist: its version {self.version} has "
                    f"{len(self._records)} shards."
                )
            outside = (first_records < 0) | (ends > self._records[shards])
            if outside.any():
                i = int(outside.nonzero()[0][0])
                shard = int(shards[i])
                raise IndexError(
                    f"Records {int(first_records[i])}..{int(ends[i]) - 1} of shard {shard} of task {self.task!r} "
                    f"are outside it: it has {int(self._records[shard])} records ({self.shard_uris[shard]})."
                )
        with self._lock:
            new = np.unique(shards[self._starts[shards] < 0]).tolist()
            if new:
                self._reader.load_offsets(self._split, new)  # of remote shards: one round trip
                self._add(new)
            return flat_byte_ranges(self._flat, self._starts, shards, first_records, counts)

    def _add(self, shards: list[int]) -> None:
        """Appends the offsets of ``shards`` (loaded by the reader) to ``_flat``."""
        tables = [self._reader.shard_offsets(self._split, shard) for shard in shards]
        needed = self._used + sum(len(table) for table in tables)
        if needed > len(self._flat):
            grown = np.empty(max(needed, 2 * len(self._flat)), np.int64)
            grown[: self._used] = self._flat[: self._used]
            self._flat = grown
        for shard, table in zip(shards, tables, strict=True):
            self._flat[self._used : self._used + len(table)] = table
            self._starts[shard] = self._used
            self._used += len(table)
