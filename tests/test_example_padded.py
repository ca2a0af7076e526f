"""decode_padded: the generic path's padded arrays, for any layout, or None (never another answer)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata import example as example_codec
from taskdata.example import decode_padded
from tests.example_helpers import example_message, message, varint

LENGTHS = {"inputs": 12, "targets": 5}


def generic(buffer: bytes, starts, ends, lengths):
    """The old read path: one bytes object per record, decode_batch, pad_features."""
    records = [buffer[a:b] for a, b in zip(np.asarray(starts).tolist(), np.asarray(ends).tolist(), strict=True)]
    return example_codec.pad_features(example_codec.decode_batch(records, dict.fromkeys(lengths, "int32")), lengths)


def spans(records):
    ends = np.cumsum([len(r) for r in records])
    return b"".join(records), ends - [len(r) for r in records], ends


def assert_agrees(buffer, starts, ends, lengths):
    """decode_padded equals the generic path, or returns None; when the generic path fails, it returns None."""
    try:
        expected = generic(buffer, starts, ends, lengths)
    except ValueError:
        expected = None
    fast = decode_padded(buffer, starts, ends, lengths)
    if fast is not None:
        assert expected is not None, "the fast path decoded records the generic path refuses"
        assert list(fast) == list(expected)
        for name in lengths:
            assert fast[name].dtype == np.int32 and fast[name].shape == expected[name].shape
            assert np.array_equal(fast[name], expected[name]), name
    return fast, expected


names = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz_/"), min_size=1, max_size=40)
token_rows = st.lists(st.integers(0, 2**28 - 1), max_size=12).map(lambda v: np.array(v, dtype=np.int64))
other_values = st.one_of(
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3).map(lambda v: np.array(v, dtype=np.int64)),
    st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=3).map(lambda v: np.array(v, dtype=np.float32)),
    st.lists(st.binary(max_size=20), min_size=1, max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_layouts_decode_exactly_as_the_generic_path(data):
    # Any number of other features (provenance or not), under any names, of every kind.
    others = data.draw(st.dictionaries(names.filter(lambda n: n not in LENGTHS), st.just(None), max_size=9))
    kinds = {name: data.draw(other_values) for name in others}
    count = data.draw(st.integers(1, 12))
    records = []
    for _ in range(count):
        row = {name: data.draw(token_rows) for name in LENGTHS}
        # Same kinds in every record (the layout), different values and lengths.
        row.update({name: data.draw(st.sampled_from([value, value[:1]])) for name, value in kinds.items()})
        records.append(example_codec.encode_example(row))
    buffer, starts, ends = spans(records)
    order = data.draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=2 * count))  # any order, repeats
    fast, expected = assert_agrees(buffer, starts[order], ends[order], LENGTHS)
    if expected is not None and all(len(example_codec.decode_example(r)["inputs"]) for r in records):
        assert fast is not None, "records of one layout must take the fast path"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_damaged_records_decode_as_the_generic_path_or_are_refused(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    records = [
        example_codec.encode_example({
            "inputs": rng.integers(0, 40_000, int(rng.integers(0, 13))), "targets": rng.integers(0, 300, 3),
            "provenance/id": [int(rng.integers(0, 2**40))], "provenance/source": "c4-00001-of-01024.json",
        })
        for _ in range(4)
    ]
    victim = data.draw(st.integers(0, 3))
    damaged = bytearray(records[victim])
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    records[victim] = bytes(damaged)
    assert_agrees(*spans(records), LENGTHS)


def test_span_corruption_shaped_records_take_the_fast_path_with_any_provenance():
    rng = np.random.default_rng(3)
    for provenance in ({}, {"provenance/id": [7]}, {f"provenance/f{i}": [i, 2**40] for i in range(9)}):
        records = [example_codec.encode_example({
            "inputs": rng.integers(1, 32_100, int(rng.integers(0, 513))), "targets": rng.integers(1, 32_100, 114),
            **provenance, "text": "a document"})
            for _ in range(64)]
        fast, _expected = assert_agrees(*spans(records), {"inputs": 512, "targets": 114})
        assert fast is not None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda r: {**r, "inputs": np.array([2**28])}, "a value of 2**28 needs a 5-byte varint"),
        (lambda r: {**r, "inputs": np.array([-1])}, "a negative id is a 10-byte varint"),
        (lambda r: {**r, "inputs": np.arange(13)}, "a row longer than its length"),
        (lambda r: {"extra": [1], **r}, "another layout: one more feature"),
        (lambda r: {**r, "targets": [1.5]}, "a feature of another kind"),
        (lambda r: {k: v for k, v in r.items() if k != "targets"}, "a feature missing"),
    ],
)
def test_records_the_fast_path_must_refuse_go_to_the_generic_path(change, why):
    rows = [{"inputs": np.arange(1, 9), "targets": np.array([3, 4]), "provenance/index": [i]} for i in range(3)]
    rows[1] = change(rows[1])
    buffer, starts, ends = spans([example_codec.encode_example(r) for r in rows])
    assert decode_padded(buffer, starts, ends, LENGTHS) is None, why
    assert_agrees(buffer, starts, ends, LENGTHS)


def test_other_serializations_of_the_same_example_go_to_the_generic_path():
    # An unpacked Int64List and a feature map entry with its fields swapped: valid, but not the layout.
    unpacked_list = b"".join(message((1, 0, v)) for v in (5, 6))
    unpacked = example_message([(b"inputs", message((3, 2, unpacked_list))),
                         (b"targets", message((3, 2, message((1, 2, varint(7))))))])  # fmt: skip
    plain = example_codec.encode_example({"inputs": [5, 6], "targets": [7]})
    buffer, starts, ends = spans([plain, unpacked])
    assert decode_padded(buffer, starts, ends, LENGTHS) is None
    _fast, expected = assert_agrees(buffer, starts, ends, LENGTHS)
    assert np.array_equal(expected["inputs"][1, :2], [5, 6])


def test_empty_rows_and_an_empty_batch_are_zero_padding():
    rows = [{"inputs": np.zeros(0, dtype=np.int64), "targets": np.array([9])}, {"inputs": [4], "targets": [1, 2]}]
    buffer, starts, ends = spans([example_codec.encode_example(r) for r in rows])
    fast, _ = assert_agrees(buffer, starts, ends, LENGTHS)
    assert fast is not None and not fast["inputs"][0].any() and fast["targets"][1, :3].tolist() == [1, 2, 0]
    empty = decode_padded(b"", np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), LENGTHS)
    assert {name: array.shape for name, array in empty.items()} == {"inputs": (0, 12), "targets": (0, 5)}


def test_no_features_asked_leaves_the_records_to_the_generic_path():
    buffer, starts, ends = spans([example_codec.encode_example({"inputs": [1]})])
    assert decode_padded(buffer, starts, ends, {}) is None


# Ids of every size a varint can have here: 1 and 2 bytes (a small vocabulary: the byte-wise path), 3 and 4
# (T5's 32,100 ids and more: put together from words), mixed in one batch in any proportion.
sized_ids = st.one_of(st.integers(0, 127), st.integers(128, 16_383), st.integers(16_384, 2**21 - 1),
                      st.integers(2**21, 2**28 - 1))  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_ids_of_every_varint_size_decode_exactly_as_the_generic_path(data):
    rows = data.draw(st.lists(st.tuples(st.lists(sized_ids, max_size=12), st.lists(sized_ids, max_size=5)),
                              min_size=1, max_size=10))  # fmt: skip
    records = [example_codec.encode_example({"inputs": np.array(i, dtype=np.int64), "targets": np.array(t, dtype=np.int64),
                                             "provenance/origin": [3, k, 2**40, 1]})
               for k, (i, t) in enumerate(rows)]  # fmt: skip
    fast, expected = assert_agrees(*spans(records), LENGTHS)
    assert fast is not None and expected is not None


def test_records_longer_than_16_kb_take_the_fast_path():
    # A record's length of 3 bytes (16,384 or more) is read from a 32-bit word, not the 16-bit table.
    rng = np.random.default_rng(5)
    records = [example_codec.encode_example({"inputs": rng.integers(2**14, 2**21, size), "targets": [1, 300, 70_000]})
               for size in (6_000, 10, 7_000)]  # fmt: skip
    assert max(len(r) for r in records) > 16_384 > min(len(r) for r in records)
    fast, _ = assert_agrees(*spans(records), {"inputs": 7_000, "targets": 3})
    assert fast is not None


def test_out_arrays_are_filled_whole_and_returned():
    # decode_padded writes every element of the arrays ``out`` gives (padding included) and returns them.
    records = [example_codec.encode_example({"inputs": np.arange(1, 1 + n, dtype=np.int64),
                                             "targets": np.array([300 * n], dtype=np.int64)}) for n in (0, 3, 12)]
    buffer, starts, ends = spans(records)
    given = {}

    def out(name, rows, length):
        given[name] = np.full((rows, length), 77, dtype=np.int32)
        return given[name]

    fast = decode_padded(buffer, starts, ends, LENGTHS, out)
    expected = generic(buffer, starts, ends, LENGTHS)
    assert fast is not None and all(fast[name] is given[name] for name in LENGTHS)
    assert all(np.array_equal(fast[name], expected[name]) for name in LENGTHS)
    assert decode_padded(b"", np.zeros(0, np.int64), np.zeros(0, np.int64), LENGTHS, out)["inputs"] is given["inputs"]
    with pytest.raises(ValueError, match="C-contiguous int32 array of shape"):
        decode_padded(buffer, starts, ends, LENGTHS, lambda name, rows, length: np.zeros((rows, length), np.int64))
