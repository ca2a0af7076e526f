"""Hand-written protobuf and drawn feature values shared by the tests of the example codec (not a test module)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

__all__ = [
    "INT64",
    "assert_same",
    "byte_lists",
    "example_message",
    "float_arrays",
    "int_arrays",
    "message",
    "varint",
]

INT64 = np.iinfo(np.int64)


def varint(value: int) -> bytes:
    value &= 2**64 - 1
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def message(*fields: tuple[int, int, bytes | int]) -> bytes:
    """Hand-written protobuf: (field, wire type, payload) with payload an int for wire type 0."""
    out = b""
    for field, wire_type, payload in fields:
        out += varint(field << 3 | wire_type)
        if wire_type == 0:
            out += varint(payload)
        elif wire_type == 2:
            out += varint(len(payload)) + payload
        else:
            out += payload
    return out


def example_message(entries: list[tuple[bytes, bytes]]) -> bytes:
    """An Example whose Features hold the given (key, serialized Feature) map entries, in order."""
    features = b"".join(message((1, 2, message((1, 2, k), (2, 2, f)))) for k, f in entries)
    return message((1, 2, features))


def assert_same(decoded: dict, expected: dict) -> None:
    assert sorted(decoded) == sorted(expected)
    for name, value in expected.items():
        if isinstance(value, list):
            assert decoded[name] == value, name
        else:
            assert decoded[name].dtype == value.dtype, name
            np.testing.assert_array_equal(decoded[name], value, err_msg=name)


# Drawn feature values: int64 and float32 arrays, lists of bytes.
int_arrays = st.lists(st.integers(INT64.min, INT64.max), max_size=40).map(
    lambda v: np.array(v, dtype=np.int64)
)
float_arrays = st.lists(st.floats(width=32, allow_nan=False), max_size=20).map(
    lambda v: np.array(v, dtype=np.float32)
)
byte_lists = st.lists(st.binary(max_size=20), min_size=1, max_size=5)
