"""``encode_example``: ``tf.train.Example`` bytes from a dict of numpy arrays, lists and strings.

It writes one canonical layout (features sorted by key, bytewise; packed lists), so equal dicts give
equal bytes anywhere. That is TensorFlow's ``SerializeToString(deterministic=True)`` byte for byte,
except for one quirk of protobuf's default Python runtime (upb): it writes a feature name after the
longer names it is a prefix of ("provenance/source_shard_index" before "provenance/source_shard"),
where the pure-Python runtime, like this module, sorts bytewise. Both parse to the same message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from taskdata.example.wire import (
    _BYTES_TAG,
    _FLOAT_TAG,
    _INT64_MAX,
    _INT64_MIN,
    _INT_TAG,
    _varint,
)

__all__ = ["encode_example"]

# ---------------------------------------------------------------------------------------------------------
# Encoding
#
# The cache job encodes every example it writes, so this path is built for one call per example:
# per feature a handful of Python operations on small bytes, and one or two numpy calls per int array.


def encode_example(features: Mapping[str, Any]) -> bytes:
    """Serializes ``features`` as a ``tf.train.Example`` in the canonical layout.

    Values: integer numpy arrays, ints or lists of ints -> Int64List; float arrays, floats or lists
    containing floats -> FloatList (stored as float32); str/bytes or lists of them -> BytesList (str as
    UTF-8). Arrays of any rank are stored flattened, as ``tf.train.Example`` has no shapes.
    """
    parts = []
    for key in sorted(features):
        value = features[key]
        if type(value) is str and len(value) <= _MAX_MEMO_CHARS:
            entry = _STRING_ENTRIES.get((key, value)) or _string_entry(key, value)
            parts.append(entry)
            continue
        feature = _feature(key, value)
        parts.append(_ENTRY_HEADS.get((key, len(feature))) or _entry_head(key, len(feature)))
        parts.append(feature)
    body = b"".join(parts)
    return b"\x0a" + _varint(len(body)) + body


# Memos of recurring bytes, each cleared when full so that it stays small whatever the input:
# everything of a Features map entry before its Feature message, by (feature name, Feature size), as a
# few names and sizes recur in every example; and whole entries of short strings, by (name, string),
# as a job writes the same task and source names into every example.
_ENTRY_HEADS: dict[tuple[str, int], bytes] = {}
_STRING_ENTRIES: dict[tuple[str, str], bytes] = {}
_MAX_MEMO_ENTRIES = 4096
_MAX_MEMO_CHARS = 256


def _entry_head(key: Any, feature_size: int) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"Feature names must be str but got {key!r} ({type(key).__name__}).")
    name = key.encode("utf-8")
    # Entry {string key = 1; Feature value = 2;} as a Features.feature (field 1) element.
    entry = b"\x0a" + _varint(len(name)) + name + b"\x12" + _varint(feature_size)
    head = b"\x0a" + _varint(len(entry) + feature_size) + entry
    if len(_ENTRY_HEADS) >= _MAX_MEMO_ENTRIES:
        _ENTRY_HEADS.clear()
    _ENTRY_HEADS[key, feature_size] = head
    return head


def _string_entry(key: str, value: str) -> bytes:
    feature = _feature(key, value)
    entry = (_ENTRY_HEADS.get((key, len(feature))) or _entry_head(key, len(feature))) + feature
    if len(_STRING_ENTRIES) >= _MAX_MEMO_ENTRIES:
        _STRING_ENTRIES.clear()
    _STRING_ENTRIES[key, value] = entry
    return entry


def _feature(key: str, value: Any) -> bytes:
    """The serialized ``Feature`` message of one value.

    The types the cache job writes (int arrays, a list of one int, str) are recognized first;
    everything else goes through :func:`_classify`.
    """
    cls = type(value)
    if cls is np.ndarray and value.dtype in _WORD_DTYPES:
        return _packed(_INT_TAG, _packed_ints(value))
    if cls is list and len(value) == 1 and type(value[0]) is int:
        if 0 <= value[0] < 0x80:
            return _SMALL_INT_FEATURES[value[0]]
        if _INT64_MIN <= value[0] <= _INT64_MAX:
            payload = _varint(value[0])  # at most 10 bytes: both lengths take one byte
            return bytes((_INT_TAG, len(payload) + 2, 0x0A, len(payload))) + payload
    if cls is list and 1 < len(value) <= _SHORT_LIST and all(type(v) is int and _INT64_MIN <= v <= _INT64_MAX
                                                               for v in value):
        return _packed(_INT_TAG, b"".join(map(_varint, value)))  # a few ids: Python is faster than numpy
    if cls is str:
        data = value.encode("utf-8")
        if len(data) < 0x7E:  # both lengths fit one byte
            return bytes((_BYTES_TAG, len(data) + 2, 0x0A, len(data))) + data
        return _bytes_list([data])
    kind, values = _classify(key, value)
    if kind == "int":
        return _packed(_INT_TAG, _packed_ints(values))
    if kind == "float":
        return _packed(_FLOAT_TAG, values.astype("<f4").tobytes())
    return _bytes_list(values)


def _packed(tag: int, payload: bytes) -> bytes:
    """A Feature holding one packed list (field 1 of Int64List or FloatList) of ``payload`` bytes."""
    size = len(payload)
    if size < 0x7E:  # the list's length and the field's length take one byte each
        # proto3 omits an empty packed field entirely (TensorFlow writes "1a 00" for an empty Int64List).
        return bytes((tag, size + 2, 0x0A, size)) + payload if size else bytes((tag, 0))
    if 0x80 <= size < 0x3FFD:  # two bytes each
        length = size + 3
        return bytes((tag, length & 0x7F | 0x80, length >> 7, 0x0A, size & 0x7F | 0x80, size >> 7)) + payload
    size_varint = _varint(size)
    return bytes((tag,)) + _varint(1 + len(size_varint) + size) + b"\x0a" + size_varint + payload


_SMALL_INT_FEATURES = tuple(bytes((_INT_TAG, 3, 0x0A, 1, v)) for v in range(0x80))
# Lists of at most this many Python ints are packed without numpy (provenance numbers, not token arrays).
_SHORT_LIST = 8


def _bytes_list(values: list[bytes]) -> bytes:
    """A Feature holding a BytesList."""
    items = b"".join([b"\x0a" + _varint(len(v)) + v for v in values])
    return b"\x0a" + _varint(len(items)) + items


def _classify(key: str, value: Any) -> tuple[str, Any]:
    """(kind, values): int64 array, float array or list of bytes."""
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value).ravel()
        dtype_kind = array.dtype.kind
        if dtype_kind in "iub":
            if dtype_kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
                raise ValueError(f"Feature {key!r}: value {array.max()} does not fit int64 (Int64List).")
            return "int", array.astype(np.int64)
        if dtype_kind == "f":
            return "float", array
        if dtype_kind in "SUO":
            return _classify(key, array.tolist())
        raise ValueError(f"Feature {key!r}: numpy dtype {array.dtype} has no tf.train.Feature kind.")
    if isinstance(value, bytes | bytearray | str):
        return "bytes", [_as_bytes(key, value)]
    if isinstance(value, bool | int | float):
        return _classify(key, [value])
    if not isinstance(value, list | tuple):
        raise ValueError(
            f"Feature {key!r}: a {type(value).__name__} cannot be stored; use a numpy array, a number, "
            "str/bytes, or a list of one of those."
        )
    if not value:
        raise ValueError(
            f"Feature {key!r}: an empty list has no kind; pass an empty numpy array with a dtype instead "
            "(e.g. np.zeros(0, np.int64))."
        )
    if all(isinstance(v, bytes | bytearray | str) for v in value):
        return "bytes", [_as_bytes(key, v) for v in value]
    if all(isinstance(v, bool | int | np.integer) for v in value):
        try:
            return "int", np.array(value, dtype=np.int64)
        except OverflowError as e:
            raise ValueError(f"Feature {key!r}: a value does not fit int64 (Int64List): {e}") from e
    if all(isinstance(v, bool | int | float | np.integer | np.floating) for v in value):
        return "float", np.array(value, dtype=np.float32)
    kinds = sorted({type(v).__name__ for v in value})
    raise ValueError(f"Feature {key!r}: a list must hold only numbers or only str/bytes, but holds {kinds}.")


def _as_bytes(key: str, value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    raise ValueError(f"Feature {key!r}: expected str or bytes but got {type(value).__name__}.")




# Packed int lists. Every varint is first written as a zero-padded little-endian word (or row of
# bytes), then the padding is deleted: apart from the varint of 0 (one 0 byte), a varint's bytes are
# never 0, so when no value is 0 one ``bytes.translate`` deletes exactly the padding.


def _varint_words(values: np.ndarray) -> np.ndarray:
    """The varints of ``values`` (all < 2**21: 1 to 3 bytes) as zero-padded "<u4" words."""
    values = values.astype(np.uint32)
    words = (values & 0x7F) | ((values >> 7 & 0x7F) << 8) | ((values >> 14) << 16)
    words |= (values >= 1 << 7).astype(np.uint32) << 7  # continuation bits
    words |= (values >= 1 << 14).astype(np.uint32) << 15
    return words.astype("<u4")


# A word whose top byte is not ASCII: no varint word of a value below 2**21 has one.
_SENTINEL = np.array([0xFFFFFFFF], dtype="<u4")
# Indexed by value: the varint of 1..65535; the sentinel at 0 (0 would leave a 0 byte) and at 65536,
# where ``take(mode="clip")`` sends every other value, negatives included.
_WORDS_16 = np.concatenate([_SENTINEL, _varint_words(np.arange(1, 1 << 16)), _SENTINEL])
# The low and high 14 bits of values below 2**28: ``_LOW_14[v & 0x3FFF] | _HIGH_14[v >> 14]`` is the
# varint of ``v`` (the high part's varint shifted two bytes up, with continuation bits on the two low
# bytes when it is not 0); every value from 2**28 up is clipped to the sentinel.
_LOW_14 = _varint_words(np.arange(1 << 14))
_HIGH_14 = np.concatenate([[0], (_LOW_14[1:] << 16) | 0x8080, _SENTINEL]).astype("<u4")
# Integer dtypes whose values numpy can use as ``take`` indices (uint64 may not fit intp).
_WORD_DTYPES = frozenset(
    np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32)
)
_GROUP_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)


def _packed_ints(values: np.ndarray) -> bytes:
    """The packed Int64List payload of an array of a ``_WORD_DTYPES`` dtype, any shape (C order)."""
    # Token ids: one gather, one check, one delete.
    token_words = _WORDS_16.take(values, mode="clip").tobytes()
    if token_words[3::4].isascii():
        return token_words.translate(None, b"\x00")
    unsigned = values.ravel().astype(np.int64).view(np.uint64)  # negatives: 64-bit two's complement
    if len(unsigned) <= 8:
        return b"".join(map(_varint, unsigned.tolist()))
    words = _LOW_14.take(unsigned & 0x3FFF)
    words |= _HIGH_14.take(unsigned >> 14, mode="clip")
    data = words.tobytes()
    if data[3::4].isascii():  # every value below 2**28
        return _squeeze(data, 4)
    rows = _varint_rows(unsigned)
    return _squeeze(rows.tobytes(), rows.shape[1])


def _varint_rows(unsigned: np.ndarray) -> np.ndarray:
    """The varints of any uint64 values as rows of zero-padded bytes, one row per value."""
    width = max(1, -(-int(unsigned.max()).bit_length() // 7))
    # Row k of ``shifted``: every value shifted right by 7k. Its low 7 bits are byte k of the varint,
    # and its bit 7 is set only if row k + 1 is not 0, where the continuation bit goes anyway. Rows
    # stay contiguous until the transpose.
    shifted = unsigned >> _GROUP_SHIFTS[:width, None]
    groups = shifted.astype(np.uint8)
    groups[:-1] |= (shifted[1:] != 0).view(np.uint8) << 7
    return np.ascontiguousarray(groups.T)


def _squeeze(data: bytes, width: int) -> bytes:
    """Packs varints written as rows of ``width`` bytes, each zero-padded after its varint."""
    if b"\x00" not in data[::width]:  # no varint of 0, so every 0 byte is padding
        return data.translate(None, b"\x00")
    rows = np.frombuffer(data, dtype=np.uint8).reshape(-1, width)
    keep = rows != 0
    keep[:, 0] = True
    return rows[keep].tobytes()
