"""Batch decoding of tf.train.Example records: agreement with the generic parser, errors, TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata import example as example_codec
from taskdata.example import batch as example_batch
from taskdata.example import wire
from taskdata.example.batch import ExampleDecodeError, RaggedFeature
from tests.example_helpers import (
    INT64,
    assert_same,
    byte_lists,
    example_message,
    float_arrays,
    int_arrays,
    message,
    varint,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(int_arrays, int_arrays, float_arrays, byte_lists), min_size=1, max_size=12))
def test_batch_decoding_equals_decoding_each_record(rows):
    records = [
        example_codec.encode_example({"inputs": a, "targets": b, "weights": w, "text": t})
        for a, b, w, t in rows
    ]
    spec = {"inputs": "int64", "targets": "int64", "weights": "float32", "text": "string"}
    batch = example_batch.decode_batch(records, spec)
    for i, record in enumerate(records):
        single = example_codec.decode_example(record)
        for name in spec:
            row = batch[name].row(i)
            if name == "text":
                assert row == single[name]
            else:
                np.testing.assert_array_equal(row, single[name])
                assert batch[name].values.dtype == np.dtype(spec[name])


def test_span_corruption_shaped_batch_decodes_to_int32_exactly():
    rng = np.random.default_rng(7)
    rows = [
        {
            "inputs": rng.integers(0, 32100, int(rng.integers(1, 513)), dtype=np.int32),
            "targets": rng.integers(0, 32100, int(rng.integers(0, 115)), dtype=np.int32),
            "_task": "c4_span_corruption",
            "_index": i * 1_000_003,
        }
        for i in range(64)
    ]
    spec = {"inputs": "int32", "targets": "int32", "_task": "string", "_index": "int64"}
    batch = example_batch.decode_batch([example_codec.encode_example(r) for r in rows], spec)
    assert batch["inputs"].values.dtype == np.int32
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(batch["inputs"].row(i), row["inputs"])
        np.testing.assert_array_equal(batch["targets"].row(i), row["targets"])
        assert batch["_task"].row(i) == [b"c4_span_corruption"]
        assert batch["_index"].row(i).tolist() == [i * 1_000_003]


def test_batches_of_one_layout_never_take_the_per_record_path(monkeypatch):
    # The whole batch is parsed at once when records share a layout, whatever that layout's key order.
    def per_record(*args):
        raise AssertionError("the per-record fallback was used")

    monkeypatch.setattr(example_batch, "_decode_each", per_record)
    rows = [
        {"z": [i, -i, 2**40], "a": "t" * i, "m": np.full(i, 0.5), "e": np.arange(i % 3)} for i in range(50)
    ]
    records = [example_codec.encode_example(r) for r in rows]
    reordered = [example_message(list(reversed(_entries(r)))) for r in records]
    for batch_records in (records, reordered):
        spec = {"z": "int64", "a": "string", "m": "float32", "e": "int32"}
        batch = example_batch.decode_batch(batch_records, spec)
        assert batch["z"].row(49).tolist() == [49, -49, 2**40]
        assert [batch["e"].row(i).tolist() for i in range(4)] == [[], [0], [0, 1], []]
        assert batch["a"].row(3) == [b"ttt"]
        assert batch["m"].row_lengths.tolist() == list(range(50))


def _entries(record: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, Feature bytes) map entries of a canonical record."""
    entries = []
    for field, _, start, end in wire._iter_fields(record, 0, len(record), "Example"):
        assert field == 1
        for _, _, es, ee in wire._iter_fields(record, start, end, "Features"):
            (_, _, ks, ke), (_, _, fs, fe) = wire._iter_fields(record, es, ee, "entry")
            entries.append((record[ks:ke], record[fs:fe]))
    return entries


def test_records_with_different_layouts_in_one_batch_still_decode():
    records = [
        example_codec.encode_example({"a": [1, 2], "b": "x"}),
        example_codec.encode_example({"a": [3], "b": "y", "extra": [0.5]}),
        example_codec.encode_example({"a": np.zeros(0, dtype=np.int64), "b": ["p", "q"]}),
    ]
    batch = example_batch.decode_batch(records, {"a": "int32", "b": "string"})
    assert batch["a"].values.tolist() == [1, 2, 3]
    assert batch["a"].row_splits.tolist() == [0, 2, 3, 3]
    assert batch["b"].values == [b"x", b"y", b"p", b"q"]
    assert batch["b"].row_lengths.tolist() == [1, 1, 2]


def test_unpacked_lists_unknown_fields_and_any_field_order_decode_like_protobuf():
    unpacked_ints = message(
        (3, 2, message((1, 0, 5), (1, 0, 2**64 - 2), (1, 2, varint(7) + varint(300))))
    )
    unpacked_floats = message(
        (2, 2, message((1, 5, np.float32(1.5).tobytes()), (1, 2, np.float32(-2).tobytes())))
    )
    bytes_feature = message((1, 2, message((1, 2, b"a"), (9, 0, 1), (1, 2, b"b"))))  # unknown field 9
    record = example_message([(b"ints", unpacked_ints), (b"floats", unpacked_floats), (b"text", bytes_feature)])
    record += message((15, 5, b"\x00\x00\x00\x00"))  # an unknown top-level fixed32 field
    expected = {
        "ints": np.array([5, -2, 7, 300], dtype=np.int64),
        "floats": np.array([1.5, -2.0], dtype=np.float32),
        "text": [b"a", b"b"],
    }
    assert_same(example_codec.decode_example(record), expected)
    batch = example_batch.decode_batch(
        [record, record], {"ints": "int64", "floats": "float32", "text": "string"}
    )
    assert batch["ints"].values.tolist() == [5, -2, 7, 300] * 2
    assert batch["floats"].values.tolist() == [1.5, -2.0] * 2


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (b"\x0a\x05\x0a\x03", "needs 5 bytes but only 2 remain"),
        (b"\x0a", "runs past the end of its field"),
        (b"\x0b", "unsupported wire type 3"),
        (b"\x08\x01", "Example.features at byte 1 has wire type 0"),
        (b"\x00", "field number 0"),
        (example_message([(b"k", message((3, 2, b"\x0a\x02\x80\x80")))]), "runs past the end"),
        (example_message([(b"k", message((3, 2, b"\x0a\x0b" + b"\xff" * 10 + b"\x01")))]), "longer than 10 bytes"),
        (example_message([(b"k", message((3, 2, b"\x0a\x0a" + b"\xff" * 9 + b"\x02")))]), "overflows 64 bits"),
        (example_message([(b"k", message((2, 2, b"\x0a\x03abc")))]), "not a multiple of 4"),
        (example_message([(b"k", message((3, 2, message((1, 5, b"abcd")))))]), "wrong wire type 5"),
        (example_message([(b"k", message((3, 0, 1)))]), "has wire type 0, expected 2"),
        (example_message([(b"\xff", message((3, 2, b"")))]), "not valid UTF-8"),
    ],
)
def test_malformed_examples_raise_value_errors_saying_what_is_wrong(record, message):
    with pytest.raises(ValueError, match=message):
        example_codec.decode_example(record)
    with pytest.raises(ExampleDecodeError, match=message) as caught:
        example_batch.decode_batch([example_codec.encode_example({"k": [1]}), record], {"k": "int64"})
    assert caught.value.record_index == 1


def test_a_damaged_feature_outside_the_spec_does_not_fail_the_batch():
    bad = message((3, 2, b"\x0a\x02\x80\x80"))  # an int list whose varint runs off its end
    record = example_message([(b"bad", bad), (b"ok", message((3, 2, message((1, 2, varint(5))))))])
    with pytest.raises(ValueError, match="runs past the end"):
        example_codec.decode_example(record)
    for records in ([record], [record, example_codec.encode_example({"ok": [6]})]):
        assert example_batch.decode_batch(records, {"ok": "int64"})["ok"].values.tolist()[0] == 5
    with pytest.raises(ExampleDecodeError, match="runs past the end"):
        example_batch.decode_batch([record], {"ok": "int64", "bad": "int64"})


def test_batch_errors_name_the_record_and_the_feature():
    good = example_codec.encode_example({"ids": [1], "text": "a"})
    with pytest.raises(
        ExampleDecodeError, match=r"Record 1 of the batch: has no feature 'ids'; it has \['text'\]"
    ):
        example_batch.decode_batch([good, example_codec.encode_example({"text": "b"})], {"ids": "int32"})
    with pytest.raises(
        ExampleDecodeError, match="feature 'text' holds bytes values but the spec asks for int64"
    ):
        example_batch.decode_batch([good], {"text": "int64"})
    too_big = example_codec.encode_example({"ids": [2**31], "text": "a"})
    with pytest.raises(
        ExampleDecodeError, match="holds 2147483648, outside int32; declare it int64"
    ) as caught:
        example_batch.decode_batch([good, good, too_big], {"ids": "int32"})
    assert caught.value.record_index == 2
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        example_batch.decode_batch([good], {"ids": "int8"})


def test_int32_bounds_and_int64_extremes_survive_batch_decoding():
    records = [
        example_codec.encode_example({"a": [-(2**31), 2**31 - 1], "b": [INT64.min, INT64.max, -1]})
    ] * 3
    batch = example_batch.decode_batch(records, {"a": "int32", "b": "int64"})
    assert batch["a"].values.tolist() == [-(2**31), 2**31 - 1] * 3
    assert batch["b"].values.tolist() == [INT64.min, INT64.max, -1] * 3


def test_an_empty_batch_has_empty_features_of_the_spec_dtypes():
    batch = example_batch.decode_batch([], {"a": "int32", "t": "string", "f": "float32"})
    assert batch["a"].values.dtype == np.int32 and len(batch["a"]) == 0
    assert batch["t"].values == [] and batch["f"].values.dtype == np.float32


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_mutated_record_decodes_like_the_generic_parser_or_fails_cleanly(data):
    # Features outside the spec are skipped unparsed on both paths (as tf.io.parse_example does).
    rows = [
        {
            "inputs": np.arange(i, i + 40) * 997,
            "_task": "t",
            "_index": i,
            "w": np.full(3, i, dtype=np.float32),
            "unrequested": np.arange(5) * 1000,
        }
        for i in range(4)
    ]
    records = [bytearray(example_codec.encode_example(r)) for r in rows]
    victim = data.draw(st.integers(0, 3))
    position = data.draw(st.integers(0, len(records[victim]) - 1))
    records[victim][position] = data.draw(st.integers(0, 255))
    records = [bytes(r) for r in records]
    spec = {"inputs": "int64", "_task": "string", "_index": "int64", "w": "float32"}
    buffer = b"".join(records)
    ends = np.cumsum([len(r) for r in records])
    starts = ends - [len(r) for r in records]
    try:
        expected = example_batch._decode_each(buffer, starts, ends, spec)
    except ValueError as err:
        with pytest.raises(ValueError) as caught:
            example_batch.decode_batch(records, spec)
        assert str(caught.value) == str(err)
        return
    batch = example_batch.decode_batch(records, spec)
    for name in spec:
        assert batch[name].row_splits.tolist() == expected[name].row_splits.tolist()
        if name == "_task":
            assert batch[name].values == expected[name].values
        else:
            np.testing.assert_array_equal(batch[name].values, expected[name].values)


def test_ragged_feature_pads_rows_and_validates_itself():
    ragged = RaggedFeature(np.array([1, 2, 3], dtype=np.int32), np.array([0, 2, 2, 3]))
    assert len(ragged) == 3
    np.testing.assert_array_equal(ragged.to_padded(3), [[1, 2, 0], [0, 0, 0], [3, 0, 0]])
    assert ragged.to_padded(2, pad_value=-1).dtype == np.int32
    with pytest.raises(ValueError, match="Record 0 of the batch has 2 values, more than the padded length 1"):
        ragged.to_padded(1)
    with pytest.raises(ValueError, match="must rise from 0 to len"):
        RaggedFeature(np.array([1, 2]), np.array([0, 3]))
    with pytest.raises(ValueError, match="1-D int64"):
        RaggedFeature(np.array([1]), np.array([0, 1], dtype=np.int32))
    with pytest.raises(TypeError, match="numeric feature"):
        RaggedFeature([b"a"], np.array([0, 1])).to_padded(2)


# ---------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------
# Against TensorFlow itself (skipped where TensorFlow is absent, as on trainer hosts).


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


@pytest.mark.slow
def test_tensorflow_batch_parse_agrees_with_decode_batch_on_random_span_corruption_rows(tf):
    rng = np.random.default_rng(3)
    rows = [
        {
            "inputs": rng.integers(0, 32100, int(rng.integers(1, 513))),
            "targets": rng.integers(0, 32100, int(rng.integers(1, 115))),
            "_task": [b"c4_span_corruption"],
        }
        for _ in range(32)
    ]
    records = [example_codec.encode_example(r) for r in rows]
    ours = example_batch.decode_batch(records, {"inputs": "int32", "targets": "int32", "_task": "string"})
    theirs = tf.io.parse_example(
        tf.constant(records),
        {"inputs": tf.io.RaggedFeature(tf.int64), "targets": tf.io.RaggedFeature(tf.int64)},
    )
    for name in ("inputs", "targets"):
        assert ours[name].values.tolist() == theirs[name].flat_values.numpy().tolist()
        assert ours[name].row_splits.tolist() == theirs[name].row_splits.numpy().tolist()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2000), st.lists(st.integers(INT64.min, INT64.max), max_size=3), st.integers(INT64.min, INT64.max)),
        min_size=1,
        max_size=12,
    )
)
def test_a_few_small_int_features_of_long_records_decode_as_each_record_does(rows):
    # Provenance ids beside 2,000-token examples: the decoder reads those features' bytes alone.
    rng = np.random.default_rng(len(rows))
    records = [
        example_codec.encode_example(
            {"inputs": rng.integers(0, 2**31 - 1, n), "ids": np.array(ids, np.int64), "ordinal": [ordinal], "name": "x"}
        )
        for n, ids, ordinal in rows
    ]
    spec = {"ids": "int64", "ordinal": "int64"}
    batch = example_batch.decode_batch(records, spec)
    for i, record in enumerate(records):
        single = example_codec.decode_example(record, spec)
        assert set(single) == set(spec)
        for name in spec:
            assert batch[name].row(i).tolist() == single[name].tolist()


def test_long_records_are_not_scanned_whole_for_a_few_small_ints(monkeypatch):
    records = [example_codec.encode_example({"inputs": np.arange(1000) + i, "id": [i]}) for i in range(64)]
    compacted = []
    original = example_batch._compact
    monkeypatch.setattr(example_batch, "_compact", lambda *a: compacted.append(1) or original(*a))
    assert example_batch.decode_batch(records, {"id": "int64"})["id"].values.tolist() == list(range(64))
    assert compacted == [1]
    example_batch.decode_batch(records, {"id": "int64", "inputs": "int32"})  # most of the bytes: the whole scan
    assert compacted == [1]
