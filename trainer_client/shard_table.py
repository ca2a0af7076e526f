"""``CacheReaderTable``: a cache reader as the ``taskdata.index.ShardTable`` of its task's version.

Byte ranges come from the shards' offsets sidecars, each loaded (and checked against the manifest) on
first use, so a host loads the sidecars of the shards it reads only; those a call needs are loaded together.
``LocalAssignments`` computes read instructions with it; ``BatchReader`` checks the files instructions name
against its ``shard_uris`` (and their byte ranges against the frames its ``CacheReader`` locates).
"""

from __future__ import annotations

import numpy as np

from taskdata.cache.reader import CacheReader

__all__ = ["CacheReaderTable"]


class CacheReaderTable:
    """The shard files and record byte ranges of ``reader``'s split ``split``."""

    def __init__(self, reader: CacheReader, split: str):
        self._reader = reader
        self._split = split
        self.task = reader.task
        self.version = reader.version_dir.rsplit("/", 1)[-1]
        self.shard_uris = tuple(reader.shard_path(split, s) for s in range(len(reader.record_counts(split))))

    def byte_ranges(
        self, shards: np.ndarray, first_records: np.ndarray, counts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(byte offsets, byte lengths) of the reads; IndexError names a read outside its shard."""
        starts = np.empty(len(shards), np.int64)
        ends = np.empty(len(shards), np.int64)
        self._reader.load_offsets(self._split, np.unique(shards).tolist())  # of remote shards: one round trip
        order = np.argsort(shards, kind="stable")
        cuts = np.flatnonzero(np.diff(shards[order])) + 1
        for mine in np.split(order, cuts) if len(order) else ():
            shard = int(shards[mine[0]])
            offsets = self._reader.shard_offsets(self._split, shard)
            firsts, lasts = first_records[mine], first_records[mine] + counts[mine]
            outside = (firsts < 0) | (lasts > len(offsets) - 1)
            if outside.any():
                i = int(np.flatnonzero(outside)[0])
                raise IndexError(
                    f"Records {int(firsts[i])}..{int(lasts[i]) - 1} of shard {shard} of task {self.task!r} are "
                    f"outside it: it has {len(offsets) - 1} records ({self.shard_uris[shard]})."
                )
            starts[mine] = offsets[firsts]
            ends[mine] = offsets[lasts]
        return starts, ends - starts
