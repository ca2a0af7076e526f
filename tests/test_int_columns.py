"""Integer columns as JSON lists or base64 of little-endian int64: what /shards writes and clients read."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskdata.index.columns import base64_int64, column_values

int64s = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40)


@given(values=int64s)
def test_base64_columns_round_trip_every_int64(values):
    encoded = base64_int64(np.array(values, np.int64))
    assert base64.b64decode(encoded) == np.array(values, "<i8").tobytes()  # little-endian, whatever the host
    assert column_values(encoded) == values
    assert column_values(values) == values  # a JSON list passes through


def test_views_and_big_endian_arrays_encode_their_values():
    values = np.arange(10, dtype=np.int64)
    assert column_values(base64_int64(values[3:7])) == [3, 4, 5, 6]
    assert column_values(base64_int64(values.astype(">i8"))) == list(range(10))
    assert base64_int64(np.zeros(0, np.int64)) == "" and column_values("") == []


@pytest.mark.parametrize(
    ("column", "error", "message"),
    [
        ("AAAA", ValueError, "whole int64 values, not 3 bytes"),
        ("not base64!", ValueError, "column's text must be base64 .* not 'not base64!'"),
        ("AAA", ValueError, "must be base64 .*the last padded with =\\), not 'AAA'"),
        ("AAAA====", ValueError, "must be base64"),  # the standard library's decoder lets extra padding through
        ("u1:AA=A", ValueError, "a u1 column's text must be base64"),
        ("u1:é", ValueError, "a u1 column's text must be base64"),
        (7, TypeError, "a list or a base64 string, not int"),
    ],
)
def test_bad_columns_are_refused_with_what_was_wrong(column, error, message):
    with pytest.raises(error, match=message):
        column_values(column)
