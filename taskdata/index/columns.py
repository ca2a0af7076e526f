"""Columns of integers in JSON: plain lists, base64 of their little-endian int64 bytes, or base64 of the
narrowest little-endian type that holds them, named in front (``"u1:..."``).

The assignment server writes each ``/shards`` read column one of these ways (``encoding=ints``, ``base64``
or ``compact``). Base64 costs the server about a quarter of the time decimal text does (bench_server); the
compact form is 1/8 to 1/2 of base64's bytes for the small integers of reads and order. Every reader
decodes any form with ``column_array`` (or ``column_values``, as a list).

Base64 is written and read with ``pybase64`` (SIMD; the same RFC 4648 text as the standard library's):
binascii runs at ~0.8 GB/s, 15-20 us of every base64 answer of 256 examples, pybase64 at 10-25x that.
"""

from __future__ import annotations

import types
from typing import Literal

import numpy as np
import pybase64

__all__ = [
    "COMPACT_COLUMN_PATTERN",
    "ColumnEncoding",
    "base64_int64",
    "base64_int64_bytes",
    "column_array",
    "column_values",
    "compact_column_bytes",
]

# How a column of integers is written: a JSON list of integers, base64 of little-endian int64, or compact.
ColumnEncoding = Literal["ints", "base64", "compact"]
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# A compact column's types, narrowest first: unsigned 1, 2 and 4 bytes, then signed 8 (any int64).
_COMPACT_TYPES = types.MappingProxyType({"u1": "<u1", "u2": "<u2", "u4": "<u4", "i8": "<i8"})
_UNSIGNED_LIMITS = ((2**8, b"u1", "<u1"), (2**16, b"u2", "<u2"), (2**32, b"u4", "<u4"))
COMPACT_COLUMN_PATTERN = r"^(u1|u2|u4|i8):([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def base64_int64(values: np.ndarray) -> str:
    """``values`` (integers that fit int64) as base64 (RFC 4648, padded) of their little-endian int64 bytes."""
    return base64_int64_bytes(values).decode("ascii")


def base64_int64_bytes(values: np.ndarray) -> bytes:
    """``base64_int64`` as ASCII bytes.

    The server calls this for every column of every answer: a contiguous little-endian int64 array is
    encoded from its own buffer, without a copy.
    """
    array = np.asarray(values)
    if array.dtype.str != "<i8" or not array.flags.c_contiguous:
        array = np.ascontiguousarray(array, "<i8")
    return pybase64.b64encode(array.data)


def compact_column_bytes(values: np.ndarray, top: int | None = None) -> bytes:
    """``values`` (integers that fit int64) as a compact column: the narrowest of ``u1``, ``u2``, ``u4``
    (values from 0 below 2^8, 2^16, 2^32) or else ``i8``, a colon, then base64 of the little-endian values.

    ``top``, if given, is a bound known without looking: every value is in [0, top] (the server knows
    it for a whole task's reads at once, and for the order from the number of tasks).
    """
    array = np.asarray(values)
    if top is None:
        top = int(array.max()) if array.size and int(array.min()) >= 0 else -1 if array.size else 0
    for limit, name, dtype in _UNSIGNED_LIMITS:
        if 0 <= top < limit:
            return name + b":" + pybase64.b64encode(array.astype(dtype).data)
    return b"i8:" + base64_int64_bytes(array)


def column_array(column: list[int] | str) -> np.ndarray:
    """The integers of a column in any form, as a read-only int64 array.

    ValueError if a list holds anything but integers of int64's range, a base64 column is not whole
    values of its type, or a compact column names a type other than u1, u2, u4 and i8; TypeError if the
    column is neither a list nor a string.
    """
    if isinstance(column, list):
        for value in column:
            if isinstance(value, bool) or not isinstance(value, int) or not _INT64_MIN <= value <= _INT64_MAX:
                raise ValueError(f"a column of integers holds int64 integers only, not {value!r}")
        array = np.array(column, np.int64)
    elif isinstance(column, str):
        # Base64's alphabet has no colon: a column with one is compact, its type in front of it.
        name, colon, text = column.rpartition(":")
        dtype = _COMPACT_TYPES.get(name) if colon else "<i8"
        if dtype is None:
            raise ValueError(
                f"a compact column starts with its type, one of {sorted(_COMPACT_TYPES)}, and a colon, not {name!r}: "
                "this client may be older than the server (ask for encoding=base64)"
            )
        try:
            data = pybase64.b64decode(text, validate=True)  # strict: the alphabet, and padding only where due
        except ValueError:  # binascii.Error, or a str that is not ASCII
            shown = text if len(text) <= 40 else text[:40] + "..."
            raise ValueError(
                f"a {name or 'base64'} column's text must be base64 (RFC 4648: A-Z, a-z, 0-9, + and /, in groups "
                f"of 4 characters, the last padded with =), not {shown!r}"
            ) from None
        width = np.dtype(dtype).itemsize
        if len(data) % width:
            what = "int64" if width == 8 else f"{width}-byte"
            raise ValueError(f"a {name or 'base64'} column must hold whole {what} values, not {len(data)} bytes")
        array = np.frombuffer(data, dtype)
        if dtype != "<i8":
            array = array.astype(np.int64)
    else:
        raise TypeError(f"a column of integers is a list or a base64 string, not {type(column).__name__}")
    array.flags.writeable = False
    return array


def column_values(column: list[int] | str) -> list[int]:
    """The integers of a column in any form, as a list (``column_array``'s errors)."""
    return column_array(column).tolist()
