"""Verified reads of record ranges from one TFRecord shard, one ranged read per range.

The shard's offsets sidecar turns records ``[first, first + count)`` into the byte range
``[offsets[first], offsets[first + count])``; every frame in it is checked against the sidecar (its
length, and its stored data CRC, which proves the record is the one written at that index) and both
CRCs of every record are verified. Files are read with plain reads, never memory-mapped, so a shard
truncated under a reader is an error naming the record, not a bus error. Works on any fsspec path
(local or ``gs://``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from taskdata import example, fs
from taskdata.cache import tfrecord

__all__ = ["ShardReader", "ShardSummary", "verify_shard"]

_SHA256 = re.compile(r"[0-9a-f]{64}")


class ShardReader:
    """Reads verified record ranges of one shard; not thread-safe (one per reading thread).

    Args:
      path: the shard (local path or fsspec URL).
      index: the shard's offsets sidecar as :func:`taskdata.cache.tfrecord.read_record_index` returns it
        (record starts, then the file length; each record's data CRC).
      max_record_bytes: records longer than this are rejected as corrupt (the manifest's maximum).
      verify_crc: check both CRCs of every record (framing is always checked against the offsets).
    """

    def __init__(
        self,
        path: str,
        index: tfrecord.RecordIndex,
        max_record_bytes: int,
        *,
        verify_crc: bool = True,
    ):
        if (
            isinstance(max_record_bytes, bool)
            or not isinstance(max_record_bytes, int)
            or max_record_bytes < 0
        ):
            raise ValueError(f"max_record_bytes must be a non-negative integer but got {max_record_bytes!r}.")
        if not isinstance(index, tfrecord.RecordIndex):
            raise TypeError(f"index must be a RecordIndex (read_record_index) but got {type(index).__name__}.")
        self._path = path
        self._offsets = index.offsets
        self._crcs = index.crcs
        self._max_record_bytes = max_record_bytes
        self._verify_crc = verify_crc
        self._file: IO[bytes] | None = None

    @property
    def path(self) -> str:
        return self._path

    @property
    def num_records(self) -> int:
        return len(self._offsets) - 1

    def read(self, first: int, count: int) -> list[bytes]:
        """The payloads of records ``[first, first + count)``, verified."""
        buffer, starts, ends = self._read_frames(first, count)
        return [buffer[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]

    def read_batch(self, first: int, count: int, feature_spec: Mapping[str, str]) -> dict[str, Any]:
        """Records ``[first, first + count)`` verified and decoded: ``{name: RaggedFeature}``.

        ``feature_spec`` maps feature names to dtypes, as :func:`taskdata.example.decode_batch`.
        A record that is not a valid example for it is reported like a corrupt record.
        """
        buffer, starts, ends = self._read_frames(first, count)
        try:
            return example.decode_buffer(buffer, starts, ends, feature_spec)
        except example.ExampleDecodeError as err:
            index = first + err.record_index
            raise tfrecord.CorruptRecordError(
                self._path, index, int(self._offsets[index]), f"it is not a valid example: {err.reason}"
            ) from err

    def _read_frames(self, first: int, count: int) -> tuple[bytes, np.ndarray, np.ndarray]:
        for name, value in (("first", first), ("count", count)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer but got {value!r}.")
        if first + count > self.num_records:
            raise IndexError(
                f"Shard {self._path} has {self.num_records} records; records [{first}, {first + count}) "
                "are out of range. The read plan does not match this cache version."
            )
        frames = self._offsets[first : first + count + 1]
        begin = int(frames[0])
        if count:
            if self._file is None:
                self._file = fs.open_file(self._path, "rb")
            self._file.seek(begin)
            buffer = tfrecord.read_full(self._file, int(frames[-1]) - begin)
            if not buffer:
                # Nothing at all from ``begin``: the file ends before this range (name its true end).
                raise tfrecord.CorruptRecordError(
                    self._path, first, begin,
                    tfrecord.truncation_reason(fs.size(self._path), begin, int(frames[1])))
        else:
            buffer = b""
        starts, ends = tfrecord.check_frames(
            buffer,
            frames - begin,
            path=self._path,
            first_index=first,
            base_offset=begin,
            max_record_bytes=self._max_record_bytes,
            expected_crcs=self._crcs[first : first + count],
            verify_crc=self._verify_crc,
        )
        return buffer, starts, ends

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class ShardSummary:
    """What :func:`verify_shard` found: a shard whose every record verified."""

    path: str
    records: int
    size_bytes: int
    sha256: str

    def __post_init__(self) -> None:
        if self.records < 0 or self.size_bytes < 0:
            raise ValueError(
                f"ShardSummary counts must be non-negative but got {self.records}, {self.size_bytes}."
            )
        if not _SHA256.fullmatch(self.sha256):
            raise ValueError(f"ShardSummary.sha256 must be 64 lowercase hex digits but got {self.sha256!r}.")


def verify_shard(
    path: str,
    index: tfrecord.RecordIndex,
    expected_count: int,
    expected_sha256: str | None = None,
    *,
    max_record_bytes: int | None = None,
    chunk_bytes: int = 32 << 20,
) -> ShardSummary:
    """Reads a whole shard sequentially and checks everything about it.

    Every frame must match the sidecar ``index`` (length and stored data CRC: every record is where
    the build put it), both CRCs of every record must match, the file
    must end exactly after the last record, the sidecar must list ``expected_count`` records, and,
    if given, the sha256 of the whole file must equal ``expected_sha256`` (the manifest's checksum).
    Reads ``chunk_bytes`` at a time (whole records), so memory stays bounded by that and one record.
    """
    table = index.offsets
    count = index.count
    if count != expected_count:
        raise ValueError(
            f"Shard {path}: its offset sidecar lists {count} records but the manifest expects {expected_count}; "
            "the sidecar belongs to another build. Rebuild the cache ('taskdata cache ... --force')."
        )
    digest = hashlib.sha256()
    with fs.open_file(path, "rb") as f:
        first = 0
        while first < count:
            # As many whole records as fit in chunk_bytes, at least one.
            last = int(np.searchsorted(table, table[first] + chunk_bytes, side="right")) - 1
            last = min(max(last, first + 1), count)
            begin, end = int(table[first]), int(table[last])
            buffer = tfrecord.read_full(f, end - begin)
            digest.update(buffer)
            tfrecord.check_frames(
                buffer,
                table[first : last + 1] - begin,
                path=path,
                first_index=first,
                base_offset=begin,
                max_record_bytes=max_record_bytes,
                expected_crcs=index.crcs[first:last],
            )
            first = last
        if f.read(1):
            raise tfrecord.CorruptRecordError(
                path,
                count,
                int(table[-1]),
                "the file continues past the end of the last record listed in the offset sidecar",
            )
    sha256 = digest.hexdigest()
    if expected_sha256 is not None and sha256 != expected_sha256:
        raise ValueError(
            f"Shard {path}: its sha256 is {sha256} but the manifest says {expected_sha256}, although every "
            "record's CRCs verify: the file was replaced by another build. Rebuild the cache "
            "('taskdata cache ... --force')."
        )
    return ShardSummary(path=path, records=count, size_bytes=int(table[-1]), sha256=sha256)
