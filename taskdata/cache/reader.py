"""Reading a complete cache version: verified records at any position, decoded to numpy.

``CacheReader`` opens a version only if it is complete (``COMPLETED`` matches the manifest) and, when
asked, only if it is exactly the version a run plan names (by the manifest's sha256). Records are read
with one ranged read per extent (consecutive records), located in O(1) by the offsets sidecar; both CRCs
of every record are checked, each record's stored data CRC must be the one the sidecar lists for its
index (so a record moved to another place is caught), and lengths beyond the manifest's maximum are
rejected. Local shards are read with ``pread``, never memory-mapped: a shard truncated under a running
reader is a ``CorruptRecordError`` naming the record and byte offsets in the file, not a bus error.
Remote shards are read by a ``RangeFetcher`` (``taskdata.cache.ranges``): ``start_spans`` starts a
batch's reads and returns at once, so a caller can keep several batches' reads in flight, and
``PendingSpans.result`` checks them as ``read_spans`` does. A shard's first read costs one request
more, its offsets sidecar (``load_offsets`` fetches many shards' sidecars at once).
Nothing here imports TensorFlow, so a trainer host does not need it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from taskdata import fs
from taskdata.cache.format import CacheFormatError, Manifest, ShardEntry, completed_path, load_manifest
from taskdata.cache.ranges import PendingRanges, RangeFetcher

if TYPE_CHECKING:  # imported on first use, as before
    from taskdata.cache.origins import OriginTable
    from taskdata.cache.shard_reader import ShardReader
    from taskdata.cache.tfrecord import RecordIndex
    from taskdata.example import RaggedFeature

__all__ = ["CacheReader", "PendingSpans", "feature_spec"]

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
    """One complete cache version of one task.

    Loading shards' offsets sidecars (``shard_offsets``, ``load_offsets``) is safe from several threads,
    so that one thread may compute read instructions while another reads with the same reader (each
    sidecar is then read once); reading records is one thread's at a time.
    """

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
        self._loading = threading.Lock()  # held while sidecars are loaded into _shards
        self._loaded: dict[str, int] = {}  # sidecars loaded, per split
        self._files: dict[tuple[str, int], int] = {}  # local shards' file descriptors, read with pread
        self._fetcher: RangeFetcher | None = None  # remote shards' reads, unless the caller gives its own
        self._origins: dict[tuple[str, int], OriginTable] = {}

    @property
    def task(self) -> str:
        return self.manifest.task

    @property
    def verify_crc(self) -> bool:
        return self._verify_crc

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
        return self.start_spans(split, shards, records).result()

    def start_spans(
        self, split: str, shards: Sequence[int] | np.ndarray, records: Sequence[int] | np.ndarray,
        fetcher: RangeFetcher | None = None,
    ) -> PendingSpans:
        """Starts :meth:`read_spans`' reads and returns at once; its ``result()`` is what ``read_spans``
        returns. Remote shards are read by ``fetcher`` (default: this reader's own), all of them in one call
        (its requests extended over the ranges announced to it), local ones when the result is asked for.
        Sidecars not loaded yet are loaded first (one round trip for all of them)."""
        shard_array = np.asarray(shards, dtype=np.int64)
        record_array = np.asarray(records, dtype=np.int64)
        if shard_array.shape != record_array.shape or shard_array.ndim != 1:
            raise ValueError("shards and records must be 1-D sequences of the same length.")
        # Each distinct record once, in file order, shard by shard; a run of consecutive records is one read.
        inverse = None
        if len(shard_array) and not (np.all(shard_array == shard_array[0]) and np.all(np.diff(record_array) == 1)):
            order = np.lexsort((record_array, shard_array))
            sorted_shards, sorted_records = shard_array[order], record_array[order]
            new = np.ones(len(order), bool)
            new[1:] = (np.diff(sorted_shards) != 0) | (np.diff(sorted_records) != 0)
            inverse = np.empty(len(order), np.int64)
            inverse[order] = np.cumsum(new) - 1
            shard_array, record_array = sorted_shards[new], sorted_records[new]
        cuts = np.flatnonzero(np.diff(shard_array)) + 1
        firsts = [0, *cuts.tolist()]
        unique = shard_array[firsts].tolist() if len(shard_array) else []
        self.load_offsets(split, unique)
        bounds = [*firsts, len(shard_array)]
        starts, ends, crcs, limits, paths = [], [], [], [], []
        for k, shard in enumerate(unique):
            reader, index = self._reader(split, shard)
            wanted = record_array[bounds[k] : bounds[k + 1]]
            if wanted[0] < 0 or wanted[-1] >= index.count:
                bad = int(wanted[0] if wanted[0] < 0 else wanted[-1])
                raise IndexError(f"Shard {reader.path} has {index.count} records; record {bad} is out of range. "
                                 "The read plan does not match this cache version.")
            starts.append(index.offsets[wanted])
            ends.append(index.offsets[wanted + 1])
            crcs.append(index.crcs[wanted])
            limits.append(self._entry(split, shard).max_record_bytes)
            paths.append(reader.path)
        records_of = _Records(
            paths, np.repeat(np.arange(len(unique)), np.diff(bounds)), record_array,
            np.concatenate(starts) if starts else np.zeros(0, np.int64),
            np.concatenate(ends) if ends else np.zeros(0, np.int64),
            np.concatenate(crcs) if crcs else np.zeros(0, np.uint32),
            np.repeat(np.asarray(limits, np.int64), np.diff(bounds)))
        # An extent (one read) is a run of consecutive records of one shard.
        first_of_extent = np.flatnonzero((np.diff(records_of.file, prepend=-1) != 0) | (np.diff(record_array, prepend=-2) != 1))
        last_of_extent = np.append(first_of_extent[1:], len(record_array))[: len(first_of_extent)] - 1
        begins = records_of.starts[first_of_extent]
        sizes = records_of.ends[last_of_extent] - begins
        extent_file = records_of.file[first_of_extent]
        reads: PendingRanges | _LocalRanges
        if fs.is_remote(self.version_dir):
            reads = (fetcher or self._own_fetcher()).start(paths, begins, sizes, extent_file)
        else:
            reads = _LocalRanges([self._file(split, shard) for shard in unique], begins.tolist(), sizes.tolist(),
                                 extent_file.tolist())
        return PendingSpans(reads, records_of, self._verify_crc, inverse)

    def decode_records(self, split: str, shards: Sequence[int] | np.ndarray, records: Sequence[int] | np.ndarray,
                       spec: Mapping[str, str] | None = None) -> dict[str, RaggedFeature]:
        """``decode(read_records(...), spec)`` without a bytes object per record: the records are decoded
        where the gathered reads put them (what the ledger does with a step's 2,048 records)."""
        from taskdata.example import decode_buffer

        buffer, starts, ends = self.read_spans(split, shards, records)
        return decode_buffer(buffer, starts, ends, spec or feature_spec(self.manifest))

    def _file(self, split: str, shard: int) -> int:
        """A local shard's raw file descriptor, read with ``pread``."""
        key = (split, int(shard))
        if key not in self._files:
            self._files[key] = os.open(self.shard_path(split, shard), os.O_RDONLY)
        return self._files[key]

    def _own_fetcher(self) -> RangeFetcher:
        with self._loading:
            if self._fetcher is None:
                self._fetcher = RangeFetcher()
            return self._fetcher

    def decode(self, records: Sequence[bytes], spec: Mapping[str, str] | None = None) -> dict[str, RaggedFeature]:
        """``{feature: RaggedFeature}`` for ``records`` (default spec: the cache's own features)."""
        from taskdata.example import decode_batch

        return decode_batch(records, spec or feature_spec(self.manifest))

    def close(self) -> None:
        for reader, _ in self._shards.values():
            reader.close()
        for fd in self._files.values():
            os.close(fd)
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None
        self._shards.clear()
        self._loaded.clear()
        self._files.clear()
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

    def load_offsets(self, split: str, shards: Iterable[int]) -> None:
        """Loads the offsets sidecars of ``shards`` not loaded yet, all at once (remote files are fetched
        concurrently: one round trip), each checked against the manifest."""
        missing = sorted({int(s) for s in shards if (split, int(s)) not in self._shards})
        if not missing:
            return
        with self._loading:
            missing = [s for s in missing if (split, s) not in self._shards]
            entries = [self._entry(split, s) for s in missing]
            paths = [fs.join(self.version_dir, entry.offsets_file) for entry in entries]
            for shard, entry, path, data in zip(missing, entries, paths, fs.read_many(paths), strict=True):
                self._shards[(split, shard)] = self._open_shard(entry, path, data)
                self._loaded[split] = self._loaded.get(split, 0) + 1

    def offsets_loaded(self, split: str) -> bool:
        """Whether every shard's offsets sidecar of ``split`` is loaded (a caller may skip finding which to load)."""
        return self._loaded.get(split, 0) == len(self.manifest.split(split).shards)

    def _reader(self, split: str, shard: int) -> tuple[ShardReader, RecordIndex]:
        """(ShardReader, RecordIndex) of one shard, its sidecar checked against the manifest."""
        found = self._shards.get((split, int(shard)))
        if found is None:
            self.load_offsets(split, [shard])
            found = self._shards[(split, int(shard))]
        return found

    def _open_shard(self, entry: ShardEntry, offsets_path: str, data: bytes | None) -> tuple[ShardReader, RecordIndex]:
        from taskdata.cache.shard_reader import ShardReader
        from taskdata.cache.tfrecord import read_record_index

        if data is None:
            raise CacheFormatError(f"Offsets sidecar {offsets_path} of shard {entry.file} is missing; run 'taskdata "
                                   "verify' and rebuild the cache.")
        if hashlib.sha256(data).hexdigest() != entry.offsets_sha256:
            raise CacheFormatError(f"Offsets sidecar {offsets_path} does not match its checksum in the manifest; "
                                   "run 'taskdata verify' and rebuild the cache.")
        index = read_record_index(data, offsets_path)
        if index.count != entry.records or int(index.offsets[-1]) != entry.bytes:
            raise CacheFormatError(f"Offsets sidecar {offsets_path} describes {index.count} records and "
                                   f"{int(index.offsets[-1])} bytes but the manifest says {entry.records} and {entry.bytes}.")
        reader = ShardReader(fs.join(self.version_dir, entry.file), index, entry.max_record_bytes,
                             verify_crc=self._verify_crc)
        return reader, index


@dataclasses.dataclass(frozen=True)
class _Records:
    """The distinct records a ``PendingSpans`` reads, in file order: each one's file (an index into ``paths``),
    record index in it, frame ``[starts, ends)`` in it, data CRC from its sidecar and the longest record its
    shard may hold."""

    paths: list[str]
    file: np.ndarray
    record: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    crcs: np.ndarray
    max_record_bytes: np.ndarray

    def corrupt(self, i: int, reason: str) -> Exception:
        """The error for record ``i``, named by its file, record and byte offset there."""
        from taskdata.cache.tfrecord import CorruptRecordError

        return CorruptRecordError(self.paths[int(self.file[i])], int(self.record[i]), int(self.starts[i]), reason)


class PendingSpans:
    """The reads ``CacheReader.start_spans`` started; ``result`` waits for them and checks every record."""

    def __init__(self, reads: PendingRanges | _LocalRanges, records: _Records, verify_crc: bool,
                 inverse: np.ndarray | None):
        self._reads = reads  # every record's frame, one after another
        self._records = records
        self._verify_crc = verify_crc
        self._inverse = inverse  # where each record asked for is among them (None: they are the ones asked for)

    def result(self) -> tuple[bytes, np.ndarray, np.ndarray]:
        """The records, verified: one buffer, and where record i of the request lies in it."""
        from taskdata.cache.tfrecord import CorruptRecordError, check_frames, truncation_reason

        records = self._records
        buffer, file_end = self._reads.result()
        frame_offsets = np.concatenate(([0], np.cumsum(records.ends - records.starts)))
        # Where a file ends early, the records before the first one it cuts are checked, then that one named
        # with the file's positions (what 'taskdata verify' says), not the buffer's.
        whole = len(records.starts) if file_end is None else int(
            np.searchsorted(frame_offsets[1:], len(buffer), side="right"))
        try:
            starts, ends = check_frames(
                buffer, frame_offsets[: whole + 1], path="", first_index=0, base_offset=0,
                max_record_bytes=records.max_record_bytes[:whole], expected_crcs=records.crcs[:whole],
                verify_crc=self._verify_crc)
        except CorruptRecordError as e:
            raise records.corrupt(e.record_index, e.reason) from e
        if file_end is not None:
            raise records.corrupt(whole, truncation_reason(file_end, int(records.starts[whole]), int(records.ends[whole])))
        if self._inverse is None:
            return buffer, starts, ends
        return buffer, starts[self._inverse], ends[self._inverse]

    def frames(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each record asked for lies in its shard, as the verified sidecars say: its frame's first byte
        and the byte after it."""
        if self._inverse is None:
            return self._records.starts, self._records.ends
        return self._records.starts[self._inverse], self._records.ends[self._inverse]

    def cancel(self) -> None:
        """Drops reads that have not started (the caller stops before asking for the result)."""
        self._reads.cancel()


class _LocalRanges:
    """Ranges of local shards, read with ``pread`` when the result is asked for: range i is
    ``[begins[i], begins[i] + sizes[i])`` of ``fds[files[i]]``."""

    def __init__(self, fds: list[int], begins: list[int], sizes: list[int], files: list[int]):
        self._fds, self._begins, self._sizes, self._files = fds, begins, sizes, files

    def result(self) -> tuple[bytes, int | None]:
        """The ranges one after another in one buffer, and None; or, where a file ends early, the whole ranges
        before the first one it cuts (and what it holds of that one), and that file's size.

        ``bytes`` (one ``pread`` per range), so that each record's CRC is one C call on a slice of it."""
        parts = []
        for begin, size, file in zip(self._begins, self._sizes, self._files, strict=True):
            data = _read_at(self._fds[file], begin, size)
            parts.append(data)
            if len(data) < size:
                return b"".join(parts), os.fstat(self._fds[file]).st_size
        return (parts[0] if len(parts) == 1 else b"".join(parts)), None

    def cancel(self) -> None:
        pass


def _read_at(fd: int, begin: int, size: int) -> bytes:
    """Up to ``size`` bytes at ``begin``; fewer only at the end of the file."""
    data = os.pread(fd, size, begin)
    while 0 < len(data) < size:  # a short read is the end of the file only once a read returns nothing
        more = os.pread(fd, size - len(data), begin + len(data))
        if not more:
            break
        data += more
    return data
