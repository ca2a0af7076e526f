"""Columns of integers in JSON: plain lists, or base64 of their little-endian int64 bytes.

The assignment server writes each ``/shards`` read column either way (``encoding=ints`` or ``base64``).
Base64 costs the server about a quarter of the time decimal text does (bench_server); every reader
decodes either form with ``column_values``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Literal

import numpy as np

__all__ = ["ColumnEncoding", "base64_int64", "column_values"]

# How a column of integers is written: a JSON list of integers, or base64 of little-endian int64.
ColumnEncoding = Literal["ints", "base64"]


def base64_int64(values: np.ndarray) -> str:
    """``values`` (integers that fit int64) as base64 (RFC 4648, padded) of their little-endian int64 bytes.

    The server calls this for every column of every answer: a little-endian int64 array goes through
    without a copy.
    """
    return binascii.b2a_base64(np.asarray(values, "<i8").tobytes(), newline=False).decode("ascii")


def column_values(column: list[int] | str) -> list[int]:
    """The integers of a column in either form; ValueError if a base64 column is not whole int64 values."""
    if isinstance(column, list):
        return column
    if not isinstance(column, str):
        raise TypeError(f"a column of integers is a list or a base64 string, not {type(column).__name__}")
    data = base64.b64decode(column, validate=True)  # binascii.Error is a ValueError
    if len(data) % 8:
        raise ValueError(f"a base64 column must hold whole int64 values, not {len(data)} bytes")
    return np.frombuffer(data, "<i8").tolist()
