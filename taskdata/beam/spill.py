"""Temporary sorted runs between the preprocessing and the shard-writing stages.

A preprocessing worker buffers (key, record) pairs of one source shard, and whenever the buffer is
full writes a *spill file*: all pairs sorted by (destination shard, key), each entry
``<u64 key><u32 length><record>``. It then describes each destination's byte range in that file as a
``Segment``. Only segment descriptors travel through Beam's shuffle, so worker memory is bounded by
the spill buffer; the shard writer merges the segments of its own shard, each read in chunks, so its
memory does not grow with the shard either.
"""

from __future__ import annotations

import dataclasses
import heapq
import struct
from collections.abc import Iterator, Sequence
from typing import IO

import numpy as np

from taskdata import fs

__all__ = ["Segment", "SpillWriter", "merge_segments", "read_segment"]

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
        sorted_keys = keys[order]
        path = f"{self._prefix}-part{self._parts:04d}.spill"
        records = self._records
        lengths = np.fromiter((len(records[i]) for i in order.tolist()), dtype=np.int64, count=order.size)
        headers = np.empty(order.size, dtype=_ENTRY_DTYPE)
        headers["key"], headers["length"] = sorted_keys, lengths
        header_bytes = headers.tobytes()
        size = _ENTRY_HEADER.size
        chunks: list[bytes] = []
        for n, i in enumerate(order.tolist()):
            chunks.append(header_bytes[n * size:(n + 1) * size])
            chunks.append(records[i])
        # Each destination's entries are one run of the sorted keys; its segment is that run's byte range.
        ends = np.zeros(order.size + 1, dtype=np.int64)
        np.cumsum(lengths + size, out=ends[1:])
        runs = [*np.searchsorted(sorted_keys, _first_keys(self._num_shards), side="left").tolist(), order.size]
        for dest in range(self._num_shards):
            first, last = runs[dest], runs[dest + 1]
            if last > first:
                self.segments.append((dest, Segment(path, int(ends[first]), int(ends[last]), last - first)))
        # Deterministic content under a deterministic name: a retried worker rewrites the same bytes.
        fs.write_atomic(path, b"".join(chunks))
        self._parts += 1
        self._keys, self._records, self._buffered = [], [], 0


_ENTRY_DTYPE = np.dtype([("key", "<u8"), ("length", "<u4")])
assert _ENTRY_DTYPE.itemsize == _ENTRY_HEADER.size


def _first_keys(num_shards: int) -> np.ndarray:
    """The smallest key of each destination shard: ``taskdata.cache.shuffle.shard_of_key(key, n) == d`` from
    ``ceil(d * 2**64 / n)`` on (tests check the two agree)."""
    return np.array([-(-(d << 64) // num_shards) for d in range(num_shards)], dtype=np.uint64)


def read_segment(segment: Segment, chunk_bytes: int = 1 << 20) -> Iterator[tuple[int, bytes]]:
    """(key, record) of every entry of ``segment``, reading ``chunk_bytes`` (or one entry, if larger) at a time."""
    with fs.open_file(segment.path, "rb") as f:
        f.seek(segment.start)
        reader = _ChunkReader(f, segment, chunk_bytes)
        for _ in range(segment.count):
            key, length = _ENTRY_HEADER.unpack(reader.take(_ENTRY_HEADER.size))
            yield key, reader.take(length)
        if reader.left():
            raise OSError(f"Spill segment {segment} holds {reader.left()} trailing bytes: it is corrupt.")


class _ChunkReader:
    """Consecutive byte strings of a segment, read from its file a chunk (or one request, if larger) at a time."""

    def __init__(self, f: IO[bytes], segment: Segment, chunk_bytes: int):
        self._f, self._segment, self._chunk_bytes = f, segment, chunk_bytes
        self._data, self._pos, self._unread = b"", 0, segment.end - segment.start

    def take(self, n: int) -> bytes:
        if self._pos + n > len(self._data):
            self._refill(n)
        self._pos += n
        return self._data[self._pos - n : self._pos]

    def left(self) -> int:
        return len(self._data) - self._pos + self._unread

    def _refill(self, n: int) -> None:
        from taskdata.cache.tfrecord import read_full

        rest = self._data[self._pos :]
        want = min(self._unread, max(self._chunk_bytes, n - len(rest)))
        more = read_full(self._f, want)
        size = self._segment.end - self._segment.start
        if len(more) < want:
            raise OSError(f"Spill file {self._segment.path} is shorter than expected ({size - self._unread + len(more)} "
                          f"bytes read of {size} at offset {self._segment.start}).")
        self._data, self._pos, self._unread = rest + more, 0, self._unread - len(more)
        if len(self._data) < n:
            raise OSError(f"Spill segment {self._segment} ends inside an entry: it is corrupt.")


def merge_segments(segments: Sequence[Segment], buffer_bytes: int = 16 << 20) -> Iterator[tuple[int, bytes]]:
    """(key, record) of every entry of ``segments`` (each sorted by key) in key order; equal keys in the order of
    ``segments``. Each segment is read in chunks, so a shard's merge holds about ``buffer_bytes`` whatever its size."""
    chunk_bytes = max(64 << 10, buffer_bytes // max(1, len(segments)))
    return heapq.merge(*(read_segment(segment, chunk_bytes) for segment in segments), key=_key)


def _key(entry: tuple[int, bytes]) -> int:
    return entry[0]
