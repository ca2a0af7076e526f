"""Columns of integers in JSON: plain lists, or base64 of their little-endian int64 bytes.

The assignment server writes each ``/shards`` read column either way (``encoding=ints`` or ``base64``).
Base64 costs the server about a quarter of the time decimal text does (bench_server); every reader
decodes either form with ``column_array`` (or ``column_values``, as a list).
"""

from __future__ import annotations

import base64
import binascii
from typing import Literal

import numpy as np

__all__ = ["ColumnEncoding", "base64_int64", "base64_int64_bytes", "column_array", "column_values"]

# How a column of integers is written: a JSON list of integers, or base64 of little-endian int64.
ColumnEncoding = Literal["ints", "base64"]
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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
    return binascii.b2a_base64(array.data, newline=False)


def column_array(column: list[int] | str) -> np.ndarray:
    """The integers of a column in either form, as a read-only int64 array.

    ValueError if a list holds anything but integers of int64's range, or a base64 column is not
    whole int64 values; TypeError if the column is neither a list nor a string.
    """
    if isinstance(column, list):
        for value in column:
            if isinstance(value, bool) or not isinstance(value, int) or not _INT64_MIN <= value <= _INT64_MAX:
                raise ValueError(f"a column of integers holds int64 integers only, not {value!r}")
        array = np.array(column, np.int64)
    elif isinstance(column, str):
        data = base64.b64decode(column, validate=True)  # binascii.Error is a ValueError
        if len(data) % 8:
            raise ValueError(f"a base64 column must hold whole int64 values, not {len(data)} bytes")
        array = np.frombuffer(data, "<i8")
    else:
        raise TypeError(f"a column of integers is a list or a base64 string, not {type(column).__name__}")
    array.flags.writeable = False
    return array


def column_values(column: list[int] | str) -> list[int]:
    """The integers of a column in either form, as a list (``column_array``'s errors)."""
    return column_array(column).tolist()
