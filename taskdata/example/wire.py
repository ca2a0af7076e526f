"""The ``tf.train.Example`` wire format: field tags, varints and message fields, shared by every codec.

The messages (proto3, ``tensorflow/core/example/{example,feature}.proto``)::

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }   // entries: { string key = 1; Feature value = 2; }
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
    Int64List { repeated int64 value = 1 [packed]; }

``encode`` writes them, ``decode`` parses one record, ``batch`` parses many at once; this module holds
what they share: the tags, varint reading and writing, and a field iterator over a message.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["Value", "has_kind"]

_KINDS = ("int", "float", "bytes", "string")
_BYTES_TAG, _FLOAT_TAG, _INT_TAG = 0x0A, 0x12, 0x1A  # Feature fields 1, 2, 3 with wire type 2.
_U64 = 0xFFFFFFFFFFFFFFFF
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Gathers of 4/8-byte words may start at the last payload byte; the padding keeps them in the buffer.
_PAD = 16
_SMALL = 24  # Packed payloads up to this many bytes are decoded in Python (cheaper than numpy calls).

Value = np.ndarray | list[bytes]


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if 0 <= value < 0x4000:  # most lengths
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    value &= _U64  # negative int64 values are written as their 64-bit two's complement (10 bytes)
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))



# ---------------------------------------------------------------------------------------------------------
# Message fields


def _iter_fields(data: bytes, pos: int, end: int, where: str) -> Iterator[tuple[int, int, int, int]]:
    """Yields (field number, wire type, a, b) for each field of the message in ``data[pos:end]``.

    For wire type 0, ``a`` is the varint's value; otherwise ``[a, b)`` is the field's payload.
    """
    while pos < end:
        key, pos = _read_varint(data, pos, end, where)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError(f"In {where}: field number 0 at byte {pos} (not a protobuf message).")
        if wire == 0:
            value, pos = _read_varint(data, pos, end, where)
            yield field, 0, value, pos
            continue
        if wire == 2:
            size, pos = _read_varint(data, pos, end, where)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise ValueError(f"In {where}: unsupported wire type {wire} (groups or invalid) at byte {pos}.")
        if pos + size > end:
            raise ValueError(
                f"In {where}: field {field} at byte {pos} needs {size} bytes but only {end - pos} remain."
            )
        yield field, wire, pos, pos + size
        pos += size


def _read_varint(data: bytes, pos: int, end: int, where: str) -> tuple[int, int]:
    value = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise ValueError(f"In {where}: a varint starting at byte {start} runs past the end of its field.")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift >= 70:
            raise ValueError(f"In {where}: the varint at byte {start} is longer than 10 bytes.")
    if value > _U64:
        raise ValueError(f"In {where}: the varint at byte {start} overflows 64 bits.")
    return value, pos


def _packed_varints(data: bytes, start: int, end: int, where: str) -> np.ndarray:
    if end - start <= _SMALL:
        small: list[int] = []
        pos = start
        while pos < end:
            value, pos = _read_varint(data, pos, end, where)
            small.append(value)
        return np.array(small, dtype=np.uint64).view(np.int64)
    raw = np.zeros(end - start + _PAD, dtype=np.uint8)
    raw[: end - start] = np.frombuffer(data, dtype=np.uint8, count=end - start, offset=start)
    ends = np.flatnonzero(raw[: end - start] < 0x80)
    if not len(ends) or ends[-1] != end - start - 1:
        raise ValueError(f"In {where}: the packed int64 list at byte {start} ends inside a varint.")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    values, error = _varints_at(raw, starts, ends - starts + 1)
    if error is not None:
        raise ValueError(f"In {where}: in the packed int64 list at byte {start}: {error}.")
    return values.view(np.int64)


# ---------------------------------------------------------------------------------------------------------
# Vectorized varints

_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)
_MASKS32 = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF, 0xFFFFFFFF], dtype=np.uint32)


def _varints_at(raw: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, str | None]:
    """Decodes the varints of ``sizes`` bytes at ``starts`` in ``raw`` (padded by ``_PAD`` zero bytes).

    Returns (uint64 values, None), or (empty, reason) when a varint is longer than 10 bytes or
    overflows 64 bits. Each varint is read as one little-endian word through an overlapping
    byte-strided view, masked to its size, and its 7-bit groups are squeezed together in log steps.
    """
    if not len(starts):
        return np.zeros(0, dtype=np.uint64), None
    longest = int(sizes.max())
    if longest > 10:
        return np.zeros(0, dtype=np.uint64), "a varint is longer than 10 bytes"
    if longest <= 4:
        words = np.take(np.ndarray((len(raw) - 3,), dtype="<u4", buffer=raw, strides=(1,)), starts)
        words &= np.take(_MASKS32, sizes)
        words = (words & np.uint32(0x007F007F)) | ((words & np.uint32(0x7F007F00)) >> np.uint32(1))
        words = (words & np.uint32(0x00003FFF)) | ((words & np.uint32(0x3FFF0000)) >> np.uint32(2))
        return words.astype(np.uint64), None
    words = np.take(np.ndarray((len(raw) - 7,), dtype="<u8", buffer=raw, strides=(1,)), starts)
    words &= np.take(_MASKS, np.minimum(sizes, 8))
    words = (words & np.uint64(0x007F007F007F007F)) | (
        (words & np.uint64(0x7F007F007F007F00)) >> np.uint64(1)
    )
    words = (words & np.uint64(0x00003FFF00003FFF)) | (
        (words & np.uint64(0x3FFF00003FFF0000)) >> np.uint64(2)
    )
    words = (words & np.uint64(0x000000000FFFFFFF)) | (
        (words & np.uint64(0x0FFFFFFF00000000)) >> np.uint64(4)
    )
    if longest > 8:
        long = np.flatnonzero(sizes > 8)
        words[long] |= (raw[starts[long] + 8].astype(np.uint64) & np.uint64(0x7F)) << np.uint64(56)
        tenth = long[sizes[long] == 10]
        last = raw[starts[tenth] + 9].astype(np.uint64)
        if np.any(last > 1):
            return np.zeros(0, dtype=np.uint64), "a 10-byte varint overflows 64 bits"
        words[tenth] |= last << np.uint64(63)
    return words, None


# ---------------------------------------------------------------------------------------------------------
# Decoded values


def has_kind(value: Value, kind: str) -> bool:
    """Whether a decoded value is of ``kind`` ("int", "float", "bytes" or "string").

    A feature with no values satisfies every kind (TensorFlow parses an empty feature as empty).
    """
    if kind not in _KINDS:
        raise ValueError(f"Unknown feature kind {kind!r}; use one of {list(_KINDS)}.")
    if isinstance(value, list):
        return not value or (kind in ("bytes", "string") and all(isinstance(v, bytes) for v in value))
    if isinstance(value, np.ndarray):
        if kind == "int":
            return value.dtype.kind in "iu"
        return kind == "float" and value.dtype.kind == "f"
    return False
