"""Temporary sorted runs between the preprocessing and the shard-writing stages.

A preprocessing worker buffers (key, record) pairs of one source shard, and whenever the buffer is
full writes a *spill file*: all pairs sorted by (destination shard, key), each entry
``<u64 key><u32 length><record>``. It then describes each destination's byte range in that file as a
``Segment``. Only segment descriptors travel through Beam's shuffle, so worker memory is bounded by
the spill buffer, and the shard writer only loads the segments of its own shard.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator

import numpy as np

from taskdata import fs
from taskdata.cache.shuffle import shard_of_key

__all__ = ["Segment", "SpillWriter", "read_segment"]

_ENTRY_HEADER = struct.Struct("<QI")


@dataclasses.dataclass(frozen=True)
class Segment:
    """Byte range ``[start, end)`` of ``path`` holding ``count`` entries of one destination shard."""

    path: str
    start: int
    end: int
    count: int

    def to_tuple(self) -> tuple[str, int, int, int]:
        return (self.path, self.start, self.end, self.count)

    @classmethod
    def from_tuple(cls, value: tuple[str, int, int, int]) -> Segment:
        return cls(*value)


class SpillWriter:
    """Buffers (key, record) pairs and writes them as sorted spill files under ``prefix``."""

    def __init__(self, prefix: str, num_shards: int, max_buffer_bytes: int = 64 << 20):
        self._prefix = prefix
        self._num_shards = num_shards
        self._max_buffer_bytes = max_buffer_bytes
        self._keys: list[int] = []
        self._records: list[bytes] = []
        self._buffered = 0
        self._parts = 0
        self.segments: list[tuple[int, Segment]] = []

    def add(self, key: int, record: bytes) -> None:
        self._keys.append(key)
        self._records.append(record)
        self._buffered += len(record) + _ENTRY_HEADER.size
        if self._buffered >= self._max_buffer_bytes:
            self._flush()

    def close(self) -> list[tuple[int, Segment]]:
        """Writes what is buffered; returns (destination shard, segment) for every non-empty range."""
        if self._keys:
            self._flush()
        return self.segments

    def _flush(self) -> None:
        keys = np.array(self._keys, dtype=np.uint64)
        # Sorting by key also sorts by destination, because destinations are key ranges.
        order = np.argsort(keys, kind="stable")
        path = f"{self._prefix}-part{self._parts:04d}.spill"
        chunks: list[bytes] = []
        offset = 0
        current, start, count = -1, 0, 0
        for i in order.tolist():
            key = int(keys[i])
            dest = shard_of_key(key, self._num_shards)
            if dest != current:
                if count:
                    self.segments.append((current, Segment(path, start, offset, count)))
                current, start, count = dest, offset, 0
            record = self._records[i]
            chunks.append(_ENTRY_HEADER.pack(key, len(record)))
            chunks.append(record)
            offset += _ENTRY_HEADER.size + len(record)
            count += 1
        if count:
            self.segments.append((current, Segment(path, start, offset, count)))
        # Deterministic content under a deterministic name: a retried worker rewrites the same bytes.
        fs.write_atomic(path, b"".join(chunks))
        self._parts += 1
        self._keys, self._records, self._buffered = [], [], 0


def read_segment(segment: Segment) -> Iterator[tuple[int, bytes]]:
    with fs.open_file(segment.path, "rb") as f:
        f.seek(segment.start)
        data = f.read(segment.end - segment.start)
    if len(data) != segment.end - segment.start:
        raise OSError(f"Spill file {segment.path} is shorter than expected ({len(data)} bytes read of "
                      f"{segment.end - segment.start} at offset {segment.start}).")
    pos = 0
    for _ in range(segment.count):
        key, length = _ENTRY_HEADER.unpack_from(data, pos)
        pos += _ENTRY_HEADER.size
        yield key, data[pos : pos + length]
        pos += length
    if pos != len(data):
        raise OSError(f"Spill segment {segment} holds {len(data) - pos} trailing bytes: it is corrupt.")
