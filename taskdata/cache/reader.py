"""Reading a complete cache version: verified records at any position, decoded to numpy.

``CacheReader`` opens a version only if it is complete (``COMPLETED`` matches the manifest) and, when
asked, only if it is exactly the version a run plan names (by the manifest's sha256). Records are read
with one ranged read per extent (consecutive records), located in O(1) by the offsets sidecar; both CRCs
of every record are checked, each record's stored data CRC must be the one the sidecar lists for its
index (so a record moved to another place is caught), and lengths beyond the manifest's maximum are
rejected. Local shards are read with ``pread``, never memory-mapped: a shard truncated under a running
reader is a ``CorruptRecordError`` naming the record and byte offsets in the file, not a bus error.
Nothing here imports TensorFlow, so a trainer host does not need it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING

import numpy as np

from taskdata import fs
from taskdata.cache.format import CacheFormatError, Manifest, ShardEntry, completed_path, load_manifest

if TYPE_CHECKING:  # imported on first use, as before
    from taskdata.cache.origins import OriginTable
    from taskdata.cache.shard_reader import ShardReader
    from taskdata.cache.tfrecord import RecordIndex
    from taskdata.example import RaggedFeature

# An open shard file: a raw file descriptor (local, read with pread) or a random-access fsspec file.
_Source = int | IO[bytes]

__all__ = ["CacheReader", "feature_spec"]

PROVENANCE = "provenance/"


def feature_spec(manifest: Manifest, include_provenance: bool = False) -> dict[str, str]:
    """Decoder dtypes for the features a cache stores (token features as int32, text as string)."""
    spec = {}
    for name, info in manifest.features.items():
        if name.startswith(PROVENANCE) and not include_provenance:
            continue
        spec[name] = "string" if info["dtype"] == "string" else ("int64" if name.startswith(PROVENANCE) else info["dtype"])
    return spec


class CacheReader:
    """One complete cache version of one task. Not thread-safe: give each reading thread its own."""

    def __init__(self, version_dir: str, *, verify_crc: bool = True, expected_manifest_sha256: str | None = None):
        self.version_dir = version_dir.rstrip("/")
        self.manifest = load_manifest(self.version_dir)
        self.manifest_sha256 = json.loads(fs.read_bytes(completed_path(self.version_dir)))["manifest_sha256"]
        if expected_manifest_sha256 is not None and expected_manifest_sha256 != self.manifest_sha256:
            raise CacheFormatError(
                f"{self.version_dir} is cache version {self.manifest_sha256[:12]} but the run plan names version "
                f"{expected_manifest_sha256[:12]} of task {self.manifest.task!r}: the plan was made for other bytes. "
                "Point the reader at the version the plan was made from, or make a new plan."
            )
        self._verify_crc = verify_crc
        self._shards: dict[tuple[str, int], tuple[ShardReader, RecordIndex]] = {}
        self._sources: dict[tuple[str, int], _Source] = {}
        self._origins: dict[tuple[str, int], OriginTable] = {}

    @property
    def task(self) -> str:
        return self.manifest.task

    def record_counts(self, split: str) -> tuple[int, ...]:
        return self.manifest.split(split).record_counts

    def max_tokens(self, split: str, feature: str) -> int:
        """The longest ``feature`` in ``split``, from the cache's ``stats.{split}.json``."""
        self.manifest.split(split)
        stats = json.loads(fs.read_bytes(fs.join(self.version_dir, f"stats.{split}.json")))
        key = f"{feature}_max_tokens"
        if key not in stats:
            raise ValueError(f"Cache of task {self.task!r} has no token feature {feature!r} in split {split!r}.")
        return int(stats[key])

    def shard_path(self, split: str, shard: int) -> str:
        return fs.join(self.version_dir, self._entry(split, shard).file)

    def shard_offsets(self, split: str, shard: int) -> np.ndarray:
        """Byte offset of every record of the shard, then the file length (checked against the manifest)."""
        return self._reader(split, shard)[1].offsets

    def shard_origins(self, split: str, shard: int) -> OriginTable | None:
        """Every record's ``provenance/origin`` from the shard's origins sidecar (``taskdata.cache.origins``),
        checked against its sha256 in the manifest on first use; None where the manifest lists no sidecars
        (caches built before them, packed rows, formats 2 and 3)."""
        origins = self.manifest.split(split).origins
        if origins is None:
            return None
        key = (split, int(shard))
        if key not in self._origins:
            from taskdata.cache.origins import read_origins

            entry, sidecar = self._entry(split, shard), origins[int(shard)]
            path = fs.join(self.version_dir, sidecar.file)
            try:
                data = fs.read_bytes(path)
            except FileNotFoundError:
                raise CacheFormatError(f"Origins sidecar {path} of shard {entry.file} is missing; run 'taskdata "
                                       "verify' and rebuild the cache.") from None
            if hashlib.sha256(data).hexdigest() != sidecar.sha256:
                raise CacheFormatError(f"Origins sidecar {path} does not match its checksum in the manifest; run "
                                       "'taskdata verify' and rebuild the cache.")
            try:
                self._origins[key] = read_origins(data, path, entry.records)
            except ValueError as e:
                raise CacheFormatError(str(e)) from None
        return self._origins[key]

    def read(self, split: str, shard: int, first: int, count: int) -> list[bytes]:
        """Records ``[first, first + count)`` of one shard, verified."""
        return self._reader(split, shard)[0].read(first, count)

    def read_records(self, split: str, shards: Sequence[int] | np.ndarray, records: Sequence[int] | np.ndarray) -> list[bytes]:
        """The records at (shards[i], records[i]), in that order, verified.

        Per shard, the frames of all requested records are gathered into one buffer (one ranged read,
        ``pread`` for local files, per extent: consecutive records) and checked in one vectorized pass,
        so scattered reads (later epochs) cost about as much as contiguous ones.
        """
        buffer, starts, ends = self.read_spans(split, shards, records)
        return [buffer[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]

    def read_spans(
        self, split: str, shards: Sequence[int] | np.ndarray, records: Sequence[int] | np.ndarray
    ) -> tuple[bytes, np.ndarray, np.ndarray]:
        """:meth:`read_records` without a bytes object per record: one buffer, and where record i lies
        in it, ``buffer[starts[i]:ends[i]]`` (int64 arrays; a record asked for twice is there once)."""
        shard_array = np.asarray(shards, dtype=np.int64)
        record_array = np.asarray(records, dtype=np.int64)
        if shard_array.shape != record_array.shape or shard_array.ndim != 1:
            raise ValueError("shards and records must be 1-D sequences of the same length.")
        unique = np.unique(shard_array).tolist()
        if len(unique) == 1:
            return self._gather(split, int(unique[0]), record_array)
        parts = []
        starts = np.zeros(len(shard_array), dtype=np.int64)
        ends = np.zeros(len(shard_array), dtype=np.int64)
        offset = 0
        for shard in unique:
            slots = np.flatnonzero(shard_array == shard)
            buffer, shard_starts, shard_ends = self._gather(split, int(shard), record_array[slots])
            starts[slots] = shard_starts + offset
            ends[slots] = shard_ends + offset
            parts.append(buffer)
            offset += len(buffer)
        return b"".join(parts), starts, ends

    def decode_records(self, split: str, shards: Sequence[int] | np.ndarray, records: Sequence[int] | np.ndarray,
                       spec: Mapping[str, str] | None = None) -> dict[str, RaggedFeature]:
        """``decode(read_records(...), spec)`` without a bytes object per record: the records are decoded
        where the gathered reads put them (what the ledger does with a step's 2,048 records)."""
        from taskdata.example import decode_buffer

        buffer, starts, ends = self.read_spans(split, shards, records)
        return decode_buffer(buffer, starts, ends, spec or feature_spec(self.manifest))

    def _gather(self, split: str, shard: int, records: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
        from taskdata.cache.tfrecord import CorruptRecordError, check_frames, truncation_reason

        reader, index = self._reader(split, shard)
        offsets = index.offsets
        count = index.count
        if len(records) and (records.min() < 0 or records.max() >= count):
            bad = int(records[(records < 0) | (records >= count)][0])
            raise IndexError(f"Shard {reader.path} has {count} records; record {bad} is out of range. "
                             "The read plan does not match this cache version.")
        # Each distinct record once, in file order; an extent (consecutive records) is one read.
        if len(records) and np.all(np.diff(records) == 1):
            wanted, slot_of = records, None  # one extent (epoch 0): nothing to sort
        else:
            wanted, slot_of = np.unique(records, return_inverse=True)
        starts, ends = offsets[wanted], offsets[wanted + 1]
        first_of_extent = np.flatnonzero(np.diff(wanted, prepend=-2) != 1)
        last_of_extent = np.append(first_of_extent[1:], len(wanted)) - 1
        begins = starts[first_of_extent].tolist()
        sizes = (ends[last_of_extent] - starts[first_of_extent]).tolist()
        buffer, file_end = _read_extents(self._source(split, shard), reader.path, begins, sizes)
        frame_offsets = np.concatenate(([0], np.cumsum(ends - starts)))
        whole = len(wanted) if file_end is None else int(np.searchsorted(frame_offsets[1:], len(buffer), side="right"))
        try:
            data_starts, data_ends = check_frames(
                buffer, frame_offsets[: whole + 1], path=reader.path, first_index=0, base_offset=0,
                max_record_bytes=self._entry(split, shard).max_record_bytes, expected_crcs=index.crcs[wanted[:whole]],
                verify_crc=self._verify_crc)
        except CorruptRecordError as e:
            # Name the record and byte offset in the shard, not in the gathered buffer.
            i = e.record_index
            raise CorruptRecordError(reader.path, int(wanted[i]), int(starts[i]), e.reason) from e
        if file_end is not None:
            # The records before the cut verified; the first one the file does not hold is named with
            # the file's positions (what 'taskdata verify' says), not the buffer's.
            raise CorruptRecordError(reader.path, int(wanted[whole]), int(starts[whole]),
                                     truncation_reason(file_end, int(starts[whole]), int(ends[whole])))
        if slot_of is None:
            return buffer, data_starts, data_ends
        # In the order asked for (a record asked for twice is there once, named twice).
        return buffer, data_starts[slot_of], data_ends[slot_of]

    def _source(self, split: str, shard: int) -> _Source:
        """A raw file descriptor (local: read with ``pread``) or a random-access fsspec file (remote)."""
        key = (split, int(shard))
        if key not in self._sources:
            path = self.shard_path(split, shard)
            if fs.is_remote(path):
                self._sources[key] = fs.open_file(path, "rb", random_access=True)
            else:
                self._sources[key] = os.open(path, os.O_RDONLY)
        return self._sources[key]

    def decode(self, records: Sequence[bytes], spec: Mapping[str, str] | None = None) -> dict[str, RaggedFeature]:
        """``{feature: RaggedFeature}`` for ``records`` (default spec: the cache's own features)."""
        from taskdata.example import decode_batch

        return decode_batch(records, spec or feature_spec(self.manifest))

    def close(self) -> None:
        for reader, _ in self._shards.values():
            reader.close()
        for source in self._sources.values():
            if isinstance(source, int):
                os.close(source)
            else:
                source.close()
        self._shards.clear()
        self._sources.clear()
        self._origins.clear()

    def __enter__(self) -> CacheReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _entry(self, split: str, shard: int) -> ShardEntry:
        shards = self.manifest.split(split).shards
        if isinstance(shard, bool) or not 0 <= int(shard) < len(shards):
            raise IndexError(f"Cache of task {self.task!r} split {split!r} has shards [0, {len(shards)}); got {shard!r}.")
        return shards[int(shard)]

    def _reader(self, split: str, shard: int) -> tuple[ShardReader, RecordIndex]:
        """(ShardReader, RecordIndex) of one shard, its sidecar checked against the manifest."""
        key = (split, int(shard))
        if key not in self._shards:
            from taskdata.cache.shard_reader import ShardReader
            from taskdata.cache.tfrecord import read_record_index

            entry = self._entry(split, shard)
            offsets_path = fs.join(self.version_dir, entry.offsets_file)
            data = fs.read_bytes(offsets_path)
            if hashlib.sha256(data).hexdigest() != entry.offsets_sha256:
                raise CacheFormatError(f"Offsets sidecar {offsets_path} does not match its checksum in the manifest; "
                                       "run 'taskdata verify' and rebuild the cache.")
            index = read_record_index(data, offsets_path)
            if index.count != entry.records or int(index.offsets[-1]) != entry.bytes:
                raise CacheFormatError(f"Offsets sidecar {offsets_path} describes {index.count} records and "
                                       f"{int(index.offsets[-1])} bytes but the manifest says {entry.records} and {entry.bytes}.")
            reader = ShardReader(fs.join(self.version_dir, entry.file), index, entry.max_record_bytes,
                                 verify_crc=self._verify_crc)
            self._shards[key] = (reader, index)
        return self._shards[key]


def _read_extents(source: _Source, path: str, begins: list[int], sizes: list[int]) -> tuple[bytes, int | None]:
    """The byte ranges ``[begins[i], begins[i] + sizes[i])`` one after another in one buffer, and None;
    or, where the file ends early, the whole ranges before its end and the file's size.

    ``bytes`` (one ``pread`` per range), so that each record's CRC is one C call on a slice of it."""
    parts = []
    for begin, size in zip(begins, sizes, strict=True):
        data = _read_at(source, begin, size)
        parts.append(data)
        if len(data) < size:
            return b"".join(parts), os.fstat(source).st_size if isinstance(source, int) else fs.size(path)
    return (parts[0] if len(parts) == 1 else b"".join(parts)), None


def _read_at(source: _Source, begin: int, size: int) -> bytes:
    """Up to ``size`` bytes at ``begin``; fewer only at the end of the file."""
    if not isinstance(source, int):
        from taskdata.cache.tfrecord import read_full

        source.seek(begin)
        return read_full(source, size)
    data = os.pread(source, size, begin)
    while 0 < len(data) < size:  # a short read is the end of the file only once a read returns nothing
        more = os.pread(source, size - len(data), begin + len(data))
        if not more:
            break
        data += more
    return data
