"""TFRecord framing, verified, plus the record-offset sidecar that makes any record one seek away.

A TFRecord file is a sequence of frames::

    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)

(all little-endian), exactly what ``tf.io.TFRecordWriter`` writes, so TensorFlow and seqio read our
shards. Nothing here imports TensorFlow: trainer hosts must not need it.

The offsets sidecar records the byte offset of every record, plus the file length as a final entry,
so a reader can turn "records [i, i+n)" into one ranged read. Its layout (little-endian)::

    b"TDOFFSET" | uint32 version (1) | uint32 crc32c(rest) | uint64 count | uint64 offsets[count + 1]

The header is 24 bytes so that the offsets are 8-byte aligned for a zero-copy numpy view.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import IO, Any

import google_crc32c
import numpy as np

__all__ = [
    "FRAME_OVERHEAD",
    "CorruptRecordError",
    "TFRecordWriter",
    "check_frames",
    "check_offsets",
    "frame_record",
    "iter_records",
    "masked_crc32c",
    "read_full",
    "read_offsets",
    "write_offsets",
]

FRAME_OVERHEAD = 16  # 8-byte length, 4-byte length CRC, 4-byte data CRC.
_HEADER = 12
_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_OFFSETS_MAGIC = b"TDOFFSET"
_OFFSETS_VERSION = 1
_OFFSETS_PREFIX = struct.Struct("<8sII")  # magic, version, crc32c of everything after it
_OFFSETS_HEADER = struct.Struct("<8sIIQ")  # ... then the record count
_crc32c = google_crc32c.value


class CorruptRecordError(ValueError):
    """A record that fails verification; names the shard, the record index and its byte offset."""

    def __init__(self, path: str, record_index: int, byte_offset: int, reason: str):
        self.path = path
        self.record_index = record_index
        self.byte_offset = byte_offset
        self.reason = reason
        super().__init__(
            f"Corrupt TFRecord shard {path}: record {record_index} at byte offset {byte_offset}: {reason}. "
            "The file is damaged or incomplete; run 'taskdata verify' on the cache and rebuild it "
            "('taskdata cache ... --force') if verification fails."
        )


def masked_crc32c(data: Any) -> int:
    """TFRecord's masked CRC32C of a bytes-like object (rotated and offset, as TensorFlow does)."""
    return _mask(_crc32c(data))


def _mask(crc: int) -> int:
    # TFRecord masks CRCs so that a CRC of data that itself contains CRCs is not trivially related.
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _mask_array(crc: np.ndarray) -> np.ndarray:
    crc = crc.astype(np.uint32)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)


def frame_record(data: bytes) -> bytes:
    """The full TFRecord frame of one record's payload."""
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), data, _CRC.pack(masked_crc32c(data))))


class TFRecordWriter:
    """Writes framed records to a binary file object and remembers where each one starts.

    Offsets count from the writer's first byte, so ``fileobj`` should be empty (a fresh shard).
    """

    def __init__(self, fileobj: IO[bytes]):
        self._file = fileobj
        self._offsets: list[int] = []
        self._position = 0

    def write(self, data: bytes) -> int:
        """Writes one record; returns the byte offset at which its frame starts."""
        frame = frame_record(bytes(data))
        offset = self._position
        self._file.write(frame)
        self._offsets.append(offset)
        self._position += len(frame)
        return offset

    @property
    def offsets(self) -> list[int]:
        """Byte offset of every record written so far."""
        return list(self._offsets)

    @property
    def position(self) -> int:
        """Bytes written so far (the file length once writing ends)."""
        return self._position

    def offsets_sidecar(self) -> bytes:
        """The offsets sidecar for the records written so far."""
        return write_offsets(self._offsets, self._position)


def read_full(fileobj: IO[bytes], size: int) -> bytes:
    """``size`` bytes from ``fileobj``, fewer only at end of file.

    A single ``read`` may legally return less than asked (raw and network file objects do), which
    must not be mistaken for a truncated shard.
    """
    data = fileobj.read(size)
    if len(data) == size or not data:
        return data
    parts = [data]
    missing = size - len(data)
    while missing:
        more = fileobj.read(missing)
        if not more:
            break
        parts.append(more)
        missing -= len(more)
    return b"".join(parts)


def iter_records(fileobj: IO[bytes], path: str, max_record_bytes: int | None = None) -> Iterator[bytes]:
    """Yields every record's payload in order, verifying both CRCs of each.

    ``path`` only names the file in errors. Truncation, a bad CRC or a length above
    ``max_record_bytes`` raise :class:`CorruptRecordError` naming the record and its offset.
    """
    index = 0
    offset = 0
    while True:
        header = read_full(fileobj, _HEADER)
        if not header:
            return
        if len(header) < _HEADER:
            raise CorruptRecordError(
                path,
                index,
                offset,
                f"file ends inside the 12-byte frame header ({len(header)} bytes present)",
            )
        (length,) = _LENGTH.unpack_from(header)
        (stored,) = _CRC.unpack_from(header, 8)
        if masked_crc32c(header[:8]) != stored:
            raise CorruptRecordError(path, index, offset, "the CRC of the length field does not match")
        if max_record_bytes is not None and length > max_record_bytes:
            raise CorruptRecordError(
                path, index, offset, f"record length {length} exceeds the maximum of {max_record_bytes} bytes"
            )
        body = read_full(fileobj, length + 4)
        if len(body) < length + 4:
            raise CorruptRecordError(
                path,
                index,
                offset,
                f"file ends inside the record: {length + 4} bytes of data and CRC expected, {len(body)} present",
            )
        data = body[:length]
        if masked_crc32c(data) != _CRC.unpack_from(body, length)[0]:
            raise CorruptRecordError(path, index, offset, "the CRC of the record data does not match")
        yield data
        index += 1
        offset += length + FRAME_OVERHEAD


def check_frames(
    buffer: bytes,
    frame_offsets: np.ndarray,
    *,
    path: str,
    first_index: int,
    base_offset: int,
    max_record_bytes: int | None,
    verify_crc: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Verifies the consecutive frames in ``buffer`` against the sidecar's offsets.

    ``frame_offsets`` holds, relative to ``buffer``, the start of each frame and then the end of the
    last one (so ``len(frame_offsets) - 1`` records). ``first_index`` and ``base_offset`` are the
    shard's index and byte offset of the first frame, used in errors. Every length field must match
    the sidecar (so framing cannot drift), and with ``verify_crc`` both CRCs of every record must
    match. Returns (data starts, data ends) relative to ``buffer``, as int64 arrays.
    """
    frame_offsets = np.asarray(frame_offsets, dtype=np.int64)
    starts = frame_offsets[:-1]
    count = len(starts)
    if count == 0:
        return starts, starts.copy()
    if len(buffer) < frame_offsets[-1]:
        # The read came back short: the shard is shorter than its sidecar says. Records before the
        # cut are checked first, so that the earliest problem is the one reported.
        i = int(np.searchsorted(frame_offsets[1:], len(buffer), side="right"))
        check_frames(
            buffer,
            frame_offsets[: i + 1],
            path=path,
            first_index=first_index,
            base_offset=base_offset,
            max_record_bytes=max_record_bytes,
            verify_crc=verify_crc,
        )
        raise CorruptRecordError(
            path,
            first_index + i,
            base_offset + int(starts[i]),
            f"the file ends at byte {base_offset + len(buffer)}, inside this record, which the offset sidecar "
            f"says ends at byte {base_offset + int(frame_offsets[i + 1])} (truncated shard)",
        )
    raw = np.frombuffer(buffer, dtype=np.uint8)
    headers = raw[starts[:, None] + np.arange(_HEADER)]
    lengths = headers[:, :8].copy().view("<u8").ravel()
    expected = np.diff(frame_offsets) - FRAME_OVERHEAD
    data_starts = starts + _HEADER
    data_ends = data_starts + expected
    failures: list[tuple[int, str]] = []

    if verify_crc:
        # One pass over the records for both CRCs; the C CRC is fast, the Python loop is the cost.
        crcs = np.array(
            [
                (_crc32c(raw[s : s + 8]), _crc32c(raw[s + _HEADER : e]))
                for s, e in zip(starts.tolist(), data_ends.tolist(), strict=True)
            ],
            dtype=np.uint32,
        )
        bad = np.flatnonzero(_mask_array(crcs[:, 0]) != headers[:, 8:12].copy().view("<u4").ravel())
        if len(bad):
            failures.append((int(bad[0]), "the CRC of the length field does not match"))
    bad = np.flatnonzero(lengths != expected.astype(np.uint64))
    if len(bad):
        i = int(bad[0])
        failures.append(
            (
                i,
                f"its length field says {int(lengths[i])} bytes but the offset sidecar says {int(expected[i])}",
            )
        )
    if max_record_bytes is not None:
        bad = np.flatnonzero(expected > max_record_bytes)
        if len(bad):
            i = int(bad[0])
            failures.append(
                (i, f"record length {int(expected[i])} exceeds the maximum of {max_record_bytes} bytes")
            )
    if verify_crc:
        stored = raw[data_ends[:, None] + np.arange(4)].copy().view("<u4").ravel()
        bad = np.flatnonzero(_mask_array(crcs[:, 1]) != stored)
        if len(bad):
            failures.append((int(bad[0]), "the CRC of the record data does not match"))
    if failures:
        # Report the earliest bad record; for that record, the first check in frame order wins.
        index, reason = min(failures, key=lambda f: f[0])
        raise CorruptRecordError(path, first_index + index, base_offset + int(starts[index]), reason)
    return data_starts, data_ends


def write_offsets(offsets: Sequence[int] | np.ndarray, file_length: int) -> bytes:
    """Serializes the record offsets of one shard and its total length into the sidecar format."""
    table = np.append(np.asarray(offsets, dtype=np.int64), np.int64(file_length))
    check_offsets(table, "<offsets being written>")
    body = struct.pack("<Q", len(table) - 1) + table.astype("<u8").tobytes()
    return _OFFSETS_PREFIX.pack(_OFFSETS_MAGIC, _OFFSETS_VERSION, _crc32c(body)) + body


def read_offsets(data: bytes, path: str) -> np.ndarray:
    """Parses and validates an offsets sidecar; returns ``count + 1`` int64 offsets (the last: file length).

    ``path`` names the sidecar in errors. The result is read-only.
    """
    fix = "rebuild the cache ('taskdata cache ... --force') to rewrite it"
    if len(data) < _OFFSETS_HEADER.size or data[:8] != _OFFSETS_MAGIC:
        raise ValueError(
            f"Offsets sidecar {path} is not a taskdata offsets file (bad magic or too short); {fix}."
        )
    _, version, crc, count = _OFFSETS_HEADER.unpack_from(data)
    if version != _OFFSETS_VERSION:
        raise ValueError(
            f"Offsets sidecar {path} has format version {version}; this taskdata reads version "
            f"{_OFFSETS_VERSION}. Upgrade taskdata or {fix}."
        )
    if _crc32c(data[_OFFSETS_PREFIX.size :]) != crc:
        raise ValueError(f"Offsets sidecar {path} fails its CRC32C check: it is damaged; {fix}.")
    expected_size = _OFFSETS_HEADER.size + 8 * (count + 1)
    if len(data) != expected_size:
        raise ValueError(
            f"Offsets sidecar {path} holds {len(data)} bytes but {count} records need {expected_size}; {fix}."
        )
    table = np.frombuffer(data, dtype="<u8", offset=_OFFSETS_HEADER.size)
    if table.max(initial=0) >= 2**63:
        raise ValueError(f"Offsets sidecar {path} holds an offset beyond 2**63; {fix}.")
    table = table.astype(np.int64)
    check_offsets(table, path)
    table.flags.writeable = False
    return table


def check_offsets(table: np.ndarray, path: str) -> None:
    """Checks that ``table`` (record starts, then file length) can describe a TFRecord file."""
    if table.ndim != 1 or len(table) < 1:
        raise ValueError(f"Offsets of {path} must be a 1-D table ending with the file length, got {table!r}.")
    if table[0] != 0:
        raise ValueError(f"Offsets of {path} must start at byte 0 but start at {int(table[0])}.")
    gaps = np.diff(table)
    bad = np.flatnonzero(gaps < FRAME_OVERHEAD)
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"Offsets of {path}: record {i} spans bytes [{int(table[i])}, {int(table[i + 1])}), shorter than the "
            f"{FRAME_OVERHEAD}-byte frame of an empty record; the sidecar does not describe a TFRecord file."
        )
