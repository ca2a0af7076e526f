"""TFRecord framing, verified, plus the record-offset sidecar that makes any record one seek away.

A TFRecord file is a sequence of frames::

    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)

(all little-endian), exactly what ``tf.io.TFRecordWriter`` writes, so TensorFlow and seqio read our
shards. Nothing here imports TensorFlow: trainer hosts must not need it.

The offsets sidecar (a ``RecordIndex``) records the byte offset of every record, plus the file length
as a final entry, so a reader can turn "records [i, i+n)" into one ranged read; and the masked CRC32C
of every record's data, so that a reader proves that the record it read at index i is the record the
build wrote there, not another valid record moved there (two records of equal length swapped, a shard
file put in another's place): the frame's stored data CRC must equal the sidecar's, a comparison of
numbers the frame check reads anyway. Its layout (little-endian)::

    b"TDOFFSET" | uint32 version (2) | uint32 crc32c(rest) | uint64 count | uint64 offsets[count + 1]
        | uint32 data_crcs[count]

The header is 24 bytes so that the offsets are 8-byte aligned for a zero-copy numpy view.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator, Sequence
from typing import IO, Protocol

import google_crc32c
import numpy as np

__all__ = [
    "FRAME_OVERHEAD",
    "CorruptRecordError",
    "RecordIndex",
    "TFRecordWriter",
    "check_frames",
    "check_offsets",
    "flat_byte_ranges",
    "frame_record",
    "iter_records",
    "masked_crc32c",
    "read_full",
    "read_offsets",
    "read_record_index",
    "truncation_reason",
    "trusted_offsets",
    "write_offsets",
]

FRAME_OVERHEAD = 16  # 8-byte length, 4-byte length CRC, 4-byte data CRC.
_HEADER = 12
_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_OFFSETS_MAGIC = b"TDOFFSET"
_OFFSETS_VERSION = 2  # 2: the data CRC of every record follows the offsets
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


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """TFRecord's masked CRC32C of a bytes-like object (rotated and offset, as TensorFlow does)."""
    return _mask(_crc32c(data))


def _mask(crc: int) -> int:
    # TFRecord masks CRCs so that a CRC of data that itself contains CRCs is not trivially related.
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _crc32c_table() -> np.ndarray:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # CRC-32C's reflected polynomial
        table.append(crc)
    return np.array(table, dtype=np.uint32)


_CRC32C_TABLE = _crc32c_table()


def _crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """The CRC32C of every row of a small uint8 matrix (a byte at a time, all rows at once)."""
    crc = np.full(len(rows), 0xFFFFFFFF, dtype=np.uint32)
    for column in range(rows.shape[1]):
        crc = _CRC32C_TABLE[(crc ^ rows[:, column]) & 0xFF] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


def _mask_array(crc: np.ndarray) -> np.ndarray:
    crc = crc.astype(np.uint32)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)


def frame_record(data: bytes) -> bytes:
    """The full TFRecord frame of one record's payload."""
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), data, _CRC.pack(masked_crc32c(data))))


class _BinaryOutput(Protocol):
    """What ``TFRecordWriter`` writes to: a binary file, or a wrapper of one (the cache job's hashing file)."""

    def write(self, data: bytes, /) -> int: ...


class TFRecordWriter:
    """Writes framed records to a binary file object and remembers where each one starts and its CRC.

    Offsets count from the writer's first byte, so ``fileobj`` should be empty (a fresh shard).
    """

    def __init__(self, fileobj: _BinaryOutput):
        self._file = fileobj
        self._offsets: list[int] = []
        self._crcs: list[int] = []
        self._position = 0

    def write(self, data: bytes) -> int:
        """Writes one record; returns the byte offset at which its frame starts."""
        data = bytes(data)
        length = _LENGTH.pack(len(data))
        crc = masked_crc32c(data)
        frame = b"".join((length, _CRC.pack(masked_crc32c(length)), data, _CRC.pack(crc)))
        offset = self._position
        self._file.write(frame)
        self._offsets.append(offset)
        self._crcs.append(crc)
        self._position += len(frame)
        return offset

    @property
    def offsets(self) -> list[int]:
        """Byte offset of every record written so far."""
        return list(self._offsets)

    @property
    def crcs(self) -> list[int]:
        """The masked CRC32C of the data of every record written so far (as stored in its frame)."""
        return list(self._crcs)

    @property
    def position(self) -> int:
        """Bytes written so far (the file length once writing ends)."""
        return self._position

    def offsets_sidecar(self) -> bytes:
        """The offsets sidecar for the records written so far."""
        return write_offsets(self._offsets, self._position, self._crcs)


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
    buffer: bytes | memoryview,
    frame_offsets: np.ndarray,
    *,
    path: str,
    first_index: int,
    base_offset: int,
    max_record_bytes: int | np.ndarray | None,
    expected_crcs: np.ndarray,
    verify_crc: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Verifies the consecutive frames in ``buffer`` against the sidecar's offsets and CRCs (and the
    records' lengths against ``max_record_bytes``: one for all, or one per record).

    ``frame_offsets`` holds, relative to ``buffer``, the start of each frame and then the end of the
    last one (so ``len(frame_offsets) - 1`` records); ``expected_crcs`` the sidecar's data CRC of each
    of those records. ``first_index`` and ``base_offset`` are the shard's index and byte offset of the
    first frame, used in errors. Every length field must match the sidecar (so framing cannot drift)
    and every frame's stored data CRC must be the sidecar's (so a record is where the build put it,
    even when both CRCs of a moved record are intact); with ``verify_crc`` both CRCs of every record
    must also match its bytes. Returns (data starts, data ends) relative to ``buffer``, as int64 arrays.
    """
    frame_offsets = np.asarray(frame_offsets, dtype=np.int64)
    starts = frame_offsets[:-1]
    count = len(starts)
    expected_crcs = np.asarray(expected_crcs, dtype=np.uint32)
    if expected_crcs.shape != (count,):
        raise ValueError(f"check_frames got {count} frames but {expected_crcs.shape} expected CRCs.")
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
            expected_crcs=expected_crcs[:i],
            verify_crc=verify_crc,
        )
        raise CorruptRecordError(
            path,
            first_index + i,
            base_offset + int(starts[i]),
            truncation_reason(base_offset + len(buffer), base_offset + int(starts[i]),
                              base_offset + int(frame_offsets[i + 1])),
        )
    raw = np.frombuffer(buffer, dtype=np.uint8)
    headers = raw[starts[:, None] + np.arange(_HEADER)]
    lengths = headers[:, :8].copy().view("<u8").ravel()
    expected = np.diff(frame_offsets) - FRAME_OVERHEAD
    data_starts = starts + _HEADER
    data_ends = data_starts + expected
    stored = raw[data_ends[:, None] + np.arange(4)].copy().view("<u4").ravel()
    failures: list[tuple[int, str]] = []

    if verify_crc:
        # The length fields' CRCs all at once (8 table lookups per record, vectorized); the data CRCs
        # one C call per record, whose Python loop is the cost.
        length_crcs = _crc32c_rows(headers[:, :8])
        # Slices of bytes cost less than numpy views (~0.5 us a record); other buffers go through numpy.
        source = buffer if isinstance(buffer, bytes) else raw
        data_crcs = np.array(
            [_crc32c(source[s:e]) for s, e in zip(data_starts.tolist(), data_ends.tolist(), strict=True)],
            dtype=np.uint32,
        )
        bad = np.flatnonzero(_mask_array(length_crcs) != headers[:, 8:12].copy().view("<u4").ravel())
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
            limit = int(np.broadcast_to(max_record_bytes, expected.shape)[i])
            failures.append((i, f"record length {int(expected[i])} exceeds the maximum of {limit} bytes"))
    if verify_crc:
        bad = np.flatnonzero(_mask_array(data_crcs) != stored)
        if len(bad):
            failures.append((int(bad[0]), "the CRC of the record data does not match"))
    bad = np.flatnonzero(stored != expected_crcs)
    if len(bad):
        i = int(bad[0])
        failures.append((i, misplaced_reason(int(stored[i]), int(expected_crcs[i]))))
    if failures:
        # Report the earliest bad record; for that record, the first check in frame order wins.
        index, reason = min(failures, key=lambda f: f[0])
        raise CorruptRecordError(path, first_index + index, base_offset + int(starts[index]), reason)
    return data_starts, data_ends


def truncation_reason(file_end: int, start: int, end: int) -> str:
    """Why a record of the sidecar's frame ``[start, end)`` cannot be read from a file of ``file_end`` bytes."""
    where = "inside" if file_end > start else "before"
    return (f"the file ends at byte {file_end}, {where} this record, which the offset sidecar says ends at byte "
            f"{end} (truncated shard)")


def misplaced_reason(stored_crc: int, expected_crc: int) -> str:
    return (f"its data CRC is {stored_crc:#010x} but the offset sidecar lists {expected_crc:#010x} for this "
            "position: another record was moved here (records or shards swapped, or the file replaced)")


@dataclasses.dataclass(frozen=True, eq=False)
class RecordIndex:
    """A shard's offsets sidecar, parsed: record starts then the file length, and each record's data CRC.

    ``offsets`` (int64, ``count + 1``) and ``crcs`` (uint32, ``count``: the masked CRC32C of each
    record's data, as stored in its frame) are read-only arrays.
    """

    offsets: np.ndarray
    crcs: np.ndarray

    def __post_init__(self) -> None:
        offsets = np.asarray(self.offsets, dtype=np.int64)
        crcs = np.asarray(self.crcs, dtype=np.uint32)
        check_offsets(offsets, "<record index>")
        if crcs.shape != (len(offsets) - 1,):
            raise ValueError(f"A record index of {len(offsets) - 1} records needs as many CRCs but got {crcs.shape}.")
        for name, array in (("offsets", offsets), ("crcs", crcs)):
            if array.flags.writeable:
                array = array.copy()
                array.flags.writeable = False
            object.__setattr__(self, name, array)

    @property
    def count(self) -> int:
        return len(self.offsets) - 1


def write_offsets(offsets: Sequence[int] | np.ndarray, file_length: int, crcs: Sequence[int] | np.ndarray) -> bytes:
    """Serializes one shard's record offsets, its total length and its records' data CRCs into a sidecar."""
    table = np.append(np.asarray(offsets, dtype=np.int64), np.int64(file_length))
    check_offsets(table, "<offsets being written>")
    crc_table = np.asarray(crcs, dtype=np.int64)
    if crc_table.shape != (len(table) - 1,) or (len(crc_table) and (crc_table.min() < 0 or crc_table.max() >= 2**32)):
        raise ValueError(f"A sidecar of {len(table) - 1} records needs as many 32-bit CRCs but got {crc_table!r}.")
    body = struct.pack("<Q", len(table) - 1) + table.astype("<u8").tobytes() + crc_table.astype("<u4").tobytes()
    return _OFFSETS_PREFIX.pack(_OFFSETS_MAGIC, _OFFSETS_VERSION, _crc32c(body)) + body


def read_offsets(data: bytes, path: str) -> np.ndarray:
    """The ``count + 1`` int64 offsets of a sidecar (the last: file length); see ``read_record_index``."""
    return read_record_index(data, path).offsets


def trusted_offsets(data: bytes, path: str) -> np.ndarray:
    """The offsets of a sidecar whose bytes are already proven to be the build's (their sha256 is the one
    in a manifest that ``COMPLETED`` commits): header and size checked, the table viewed in place
    (int64, read-only). ~20x cheaper than ``read_record_index``, which validates everything: what a
    65,536-shard cache's first use needs."""
    if len(data) < _OFFSETS_HEADER.size or data[:8] != _OFFSETS_MAGIC:
        raise ValueError(f"Offsets sidecar {path} is not a taskdata offsets file (bad magic or too short).")
    _, version, _, count = _OFFSETS_HEADER.unpack_from(data)
    if version != _OFFSETS_VERSION or len(data) != _OFFSETS_HEADER.size + 12 * count + 8:
        raise ValueError(f"Offsets sidecar {path} has version {version} and {len(data)} bytes for {count} records; "
                         f"this taskdata reads version {_OFFSETS_VERSION}.")
    return np.frombuffer(data, dtype="<i8", offset=_OFFSETS_HEADER.size, count=count + 1)


def read_record_index(data: bytes, path: str) -> RecordIndex:
    """Parses and validates an offsets sidecar. ``path`` names the sidecar in errors."""
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
    crcs_start = _OFFSETS_HEADER.size + 8 * (count + 1)
    expected_size = crcs_start + 4 * count
    if len(data) != expected_size:
        raise ValueError(
            f"Offsets sidecar {path} holds {len(data)} bytes but {count} records need {expected_size}; {fix}."
        )
    table = np.frombuffer(data, dtype="<u8", offset=_OFFSETS_HEADER.size, count=count + 1)
    if table.max(initial=0) >= 2**63:
        raise ValueError(f"Offsets sidecar {path} holds an offset beyond 2**63; {fix}.")
    table = table.astype(np.int64)
    check_offsets(table, path)
    table.flags.writeable = False
    return RecordIndex(table, np.frombuffer(data, dtype="<u4", offset=crcs_start, count=count).astype(np.uint32))


def flat_byte_ranges(
    flat: np.ndarray, table_starts: np.ndarray, shards: np.ndarray, first_records: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(byte offsets, byte lengths) of records ``[first_records[i], first_records[i] + counts[i])`` of shard
    ``shards[i]``, from offset tables laid end to end in ``flat`` (shard ``s``'s from ``table_starts[s]``): a few
    array operations for any number of reads. The reads must lie inside their shards; that is not checked here."""
    at = table_starts[shards] + first_records
    starts = flat[at]
    return starts, flat[at + counts] - starts


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
