"""tf.train.Example encoding and generic decoding without TensorFlow: golden bytes, a plain reference
encoder, every varint path, round trips, and TensorFlow's own bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata import example as example_codec
from taskdata.example import batch as example_batch
from taskdata.example import encode, wire
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

# Recipe (TensorFlow 2.21): tf.train.Example(features=tf.train.Features(feature={
#   "ids": Feature(int64_list=Int64List(value=[1, 300, -1])), "text": Feature(bytes_list=BytesList(value=[b"hi"])),
#   "w": Feature(float_list=FloatList(value=[0.5]))})).SerializeToString(deterministic=True).hex()
GOLDEN = bytes.fromhex(
    "0a390a180a0369647312111a0f0a0d01ac02ffffffffffffffffff010a0e0a047465787412060a040a0268690a0d0a017712"
    "0812060a040000003f"
)
GOLDEN_FEATURES = {"w": 0.5, "text": "hi", "ids": [1, 300, -1]}


def test_encoding_is_byte_identical_to_tensorflows_deterministic_serialization():
    assert example_codec.encode_example(GOLDEN_FEATURES) == GOLDEN


def test_golden_bytes_decode_to_the_recipe_values():
    decoded = example_codec.decode_example(GOLDEN)
    assert_same(
        decoded,
        {
            "ids": np.array([1, 300, -1], dtype=np.int64),
            "text": [b"hi"],
            "w": np.array([0.5], dtype=np.float32),
        },
    )


def test_encoding_is_canonical_whatever_the_insertion_order_and_value_types():
    a = example_codec.encode_example({"b": np.array([5, 6], dtype=np.int32), "a": b"x", "c": [1.5]})
    b = example_codec.encode_example({"c": np.array([1.5], dtype=np.float64), "a": "x", "b": [5, 6]})
    assert a == b
    # Negative control: one value changed gives other bytes.
    assert example_codec.encode_example({"b": [5, 7], "a": "x", "c": [1.5]}) != a


def test_values_of_every_supported_type_encode_to_their_kind():
    decoded = example_codec.decode_example(
        example_codec.encode_example(
            {
                "bool": np.array([True, False]),
                "uint": np.array([2**63 - 1], dtype=np.uint64),
                "scalar_int": 7,
                "scalar_float": 2.5,
                "np_scalar": np.int16(-3),
                "strings": np.array(["é", "b"]),
                "matrix": np.arange(6).reshape(2, 3),
                "mixed_numbers": [1, 2.5],
                "empty_floats": np.zeros(0, dtype=np.float32),
            }
        )
    )
    assert_same(
        decoded,
        {
            "bool": np.array([1, 0]),
            "uint": np.array([2**63 - 1]),
            "scalar_int": np.array([7]),
            "scalar_float": np.array([2.5], dtype=np.float32),
            "np_scalar": np.array([-3]),
            "strings": ["é".encode(), b"b"],
            "matrix": np.arange(6),
            "mixed_numbers": np.array([1, 2.5], dtype=np.float32),
            "empty_floats": np.zeros(0, dtype=np.float32),
        },
    )


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ({"x": []}, "an empty list has no kind"),
        ({"x": [1, "a"]}, r"holds \['int', 'str'\]"),
        ({"x": np.array([2**64 - 1], dtype=np.uint64)}, "does not fit int64"),
        ({"x": [2**64]}, "does not fit int64"),
        ({"x": {"a": 1}}, "a dict cannot be stored"),
        ({"x": np.array([1 + 2j])}, "has no tf.train.Feature kind"),
        ({3: [1]}, "Feature names must be str"),
        ({3: "x"}, "Feature names must be str"),
    ],
)
def test_unencodable_values_are_errors_naming_the_feature(features, message):
    with pytest.raises((ValueError, TypeError), match=message):
        example_codec.encode_example(features)


feature_dicts = st.dictionaries(
    st.text(min_size=0, max_size=8), st.one_of(int_arrays, float_arrays, byte_lists), max_size=6
)


@settings(max_examples=200, deadline=None)
@given(feature_dicts)
def test_encode_then_decode_round_trips(features):
    decoded = example_codec.decode_example(example_codec.encode_example(features))
    assert_same(decoded, features)


def test_protobuf_merge_rules_apply_to_repeated_keys_and_kinds():
    first = message((3, 2, message((1, 2, varint(1)))))
    second = message((1, 2, message((1, 2, b"z"))))
    record = example_message([(b"k", first), (b"k", second)])  # the same key twice: the last entry wins
    assert example_codec.decode_example(record) == {"k": [b"z"]}
    # Within one Feature, a second member of the oneof replaces the first; the same member merges.
    feature = message((3, 2, message((1, 0, 1))), (3, 2, message((1, 0, 2))))
    assert example_codec.decode_example(example_message([(b"k", feature)]))["k"].tolist() == [1, 2]
    empty = example_codec.decode_example(example_message([(b"k", b"")]))
    assert empty == {"k": []}


def test_long_packed_lists_use_the_vectorized_decoder_with_the_same_errors():
    values = np.array(
        [0, 1, 127, 128, 2**28, 2**35, 2**56 - 1, 2**56, INT64.max, -1, INT64.min], dtype=np.int64
    )
    record = example_codec.encode_example({"k": np.tile(values, 5)})
    np.testing.assert_array_equal(example_codec.decode_example(record)["k"], np.tile(values, 5))
    truncated = example_message([(b"k", message((3, 2, message((1, 2, b"\x01" * 40 + b"\x80")))))])
    with pytest.raises(ValueError, match="ends inside a varint"):
        example_codec.decode_example(truncated)


def test_has_kind():
    assert example_codec.has_kind(np.array([1]), "int")
    assert not example_codec.has_kind(np.array([1]), "float")
    assert example_codec.has_kind(np.array([1.0], dtype=np.float32), "float")
    assert example_codec.has_kind([b"a"], "bytes") and example_codec.has_kind([b"a"], "string")
    assert not example_codec.has_kind([b"a"], "int")
    assert example_codec.has_kind([], "int")  # a feature with no values satisfies every kind
    with pytest.raises(ValueError, match="Unknown feature kind 'str'"):
        example_codec.has_kind([b"a"], "str")


# ---------------------------------------------------------------------------------------------------------
# The encoder against a plain reference: protobuf's rules written out, one varint per Python int.


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _reference_encode(features: dict) -> bytes:
    entries = b""
    for key in sorted(features):
        value = _canonical(features[key])
        if isinstance(value, list):
            feature = _field(1, b"".join(_field(1, v) for v in value))
        else:
            if value.dtype.kind == "f":
                number, payload = 2, value.astype("<f4").tobytes()
            else:
                number, payload = 3, b"".join(varint(v) for v in value.tolist())
            feature = _field(number, _field(1, payload) if payload else b"")
        entries += _field(1, _field(1, key.encode()) + _field(2, feature))
    return _field(1, entries)


def _canonical(value):
    """A list of bytes, or a 1-D int64 / float32 array: what the Feature holds."""
    if isinstance(value, str | bytes):
        return [value.encode() if isinstance(value, str) else value]
    if isinstance(value, list) and all(isinstance(v, str | bytes) for v in value):
        return [v.encode() if isinstance(v, str) else v for v in value]
    array = np.ravel(np.asarray(value))
    return array.astype(np.float32) if array.dtype.kind == "f" else array.astype(np.int64)


EDGES = [0, 1, 127, 128, 2**14 - 1, 2**14, 2**16 - 1, 2**16, 2**16 + 1, 2**21 - 1, 2**21, 2**28 - 1, 2**28]
EDGES += [2**31 - 1, 2**32 - 1, 2**56, INT64.max, -1, -128, -(2**31), INT64.min]
INT_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", ">i4", ">i8"]


@st.composite
def any_int_arrays(draw) -> np.ndarray:
    """Int arrays of every dtype, layout (flat, 2-D, strided view) and value range, edges included."""
    dtype = np.dtype(draw(st.sampled_from(INT_DTYPES)))
    low, high = (
        (0, 1) if dtype.kind == "b" else (int(np.iinfo(dtype).min), min(int(np.iinfo(dtype).max), INT64.max))
    )
    value = st.one_of(
        st.integers(1, 2**16 - 1),  # token ids
        st.integers(0, 2**28),
        st.sampled_from(EDGES),
        st.integers(INT64.min, INT64.max),
    ).map(lambda v: min(max(v, low), high))
    values = draw(st.lists(value, max_size=60))
    layout = draw(st.sampled_from(["flat", "matrix", "strided"]))
    array = np.array(values, dtype=dtype)
    if layout == "matrix" and len(array) % 2 == 0:
        return array.reshape(2, -1)
    return array[::2] if layout == "strided" else array


@st.composite
def cache_records(draw) -> dict:
    """A dict shaped like the cache job's records: token arrays and provenance features."""
    tokens = st.lists(st.integers(1, 32099), max_size=600).map(lambda v: np.array(v, dtype=np.int32))
    ints = st.one_of(st.integers(0, 2**20), st.sampled_from(EDGES))
    record = {
        "inputs": draw(st.one_of(tokens, any_int_arrays())),
        "targets": draw(tokens),
        "provenance/task": draw(st.text(max_size=140)),
        "provenance/source_shard": draw(st.sampled_from(["c4-train.00000-of-01024.json", ""])),
        "provenance/source_shard_index": [draw(ints)],
        "provenance/index_within_shard": [draw(ints)],
        "provenance/preprocessors_seed": [draw(ints)],
        "weights": draw(float_arrays),
        "texts": draw(byte_lists),
    }
    if draw(st.booleans()):  # a name that is a prefix of another one (see the upb test below)
        del record["provenance/source_shard_index"]
    return record


@settings(max_examples=300, deadline=None)
@given(any_int_arrays())
def test_int_arrays_encode_like_the_reference(array):
    features = {"ids": array}
    assert example_codec.encode_example(features) == _reference_encode(features)


@settings(max_examples=150, deadline=None)
@given(cache_records())
def test_cache_shaped_records_encode_like_the_reference(record):
    assert example_codec.encode_example(record) == _reference_encode(record)


@settings(max_examples=200, deadline=None)
@given(any_int_arrays())
def test_the_fast_varint_paths_equal_the_general_one(array):
    unsigned = array.ravel().astype(np.int64).view(np.uint64)
    rows = encode._varint_rows(unsigned) if len(unsigned) else np.zeros((0, 1), dtype=np.uint8)
    general = encode._squeeze(rows.tobytes(), rows.shape[1])
    assert encode._packed_ints(array) == general
    assert general == b"".join(varint(v) for v in unsigned.tolist())


@pytest.mark.parametrize(
    "values",
    [
        np.arange(1, 2**16, dtype=np.int32),  # the whole table
        np.arange(0, 2**16 + 200, dtype=np.int64),  # with 0 and values past the table
        np.concatenate([np.arange(2**k - 300, 2**k + 300) for k in (21, 28)]),  # around 2**21 and 2**28
        np.array([2**28 - 1, 0, 1] * 5, dtype=np.uint32),
        np.array(EDGES * 3, dtype=np.int64),  # negatives: 10 bytes each
        np.zeros(40, dtype=np.int16),
    ],
)
def test_every_varint_path_writes_protobufs_varints(values):
    assert encode._packed_ints(values) == b"".join(
        varint(v) for v in values.astype(np.int64).tolist()
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(EDGES), st.integers(INT64.min, INT64.max), st.integers(0, 2**20)),
                min_size=1, max_size=12))
def test_short_lists_of_python_ints_encode_like_the_reference(values):
    # Up to encode._SHORT_LIST ints take a path without numpy (provenance numbers); longer ones the arrays'.
    for features in ({"ids": values}, {"ids": values, "provenance/origin": values[:4], "tokens": np.array(values)}):
        assert example_codec.encode_example(features) == _reference_encode(features)


def test_short_lists_out_of_int64_or_of_bools_take_the_general_path():
    with pytest.raises(ValueError, match="'ids': a value does not fit int64"):
        example_codec.encode_example({"ids": [1, 2**63]})
    assert example_codec.encode_example({"b": [True, False, True]}) == _reference_encode({"b": [1, 0, 1]})


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 128, 129, 0x3FFC, 0x3FFD, 0x3FFE, 0x4000, 0x4001])
def test_length_prefixes_of_every_width_match_the_reference(size):
    # Sizes around the one- and two-byte lengths of the Feature's list and its packed field.
    for features in (
        {"ids": np.ones(size, dtype=np.int32)},
        {"floats": np.ones(size // 4, dtype=np.float32)},
        {"text": "x" * size},
        {"texts": [b"y" * size, b"z"]},
        {"k" * size: [1]},
    ):
        assert example_codec.encode_example(features) == _reference_encode(features)


def test_memos_stay_bounded_and_never_change_the_bytes(monkeypatch):
    monkeypatch.setattr(encode, "_MAX_MEMO_ENTRIES", 4)
    features = {f"k{i}": np.arange(1, 1 + i * 50, dtype=np.int32) for i in range(10)}
    features |= {f"s{i}": "é" * i for i in range(10)}
    features["long"] = "x" * (encode._MAX_MEMO_CHARS + 1)  # never memoized
    for _ in range(2):
        assert example_codec.encode_example(features) == _reference_encode(features)
        assert len(encode._ENTRY_HEADS) <= 4 and len(encode._STRING_ENTRIES) <= 4
    # A memoized entry is only reused for the same name and string.
    assert example_codec.encode_example({"s1": "b"}) == _reference_encode({"s1": "b"})


def test_the_example_package_exports_every_codec():
    for name in ("DTYPES", "ExampleDecodeError", "RaggedFeature", "decode_batch", "decode_buffer"):
        assert getattr(example_codec, name) is getattr(example_batch, name)
    assert example_codec.encode_example is encode.encode_example
    assert sorted(example_codec.__all__) == [
        "DTYPES", "ExampleDecodeError", "RaggedFeature", "decode_batch", "decode_buffer", "decode_example",
        "decode_padded", "encode_example", "has_kind", "pad_features",
    ]


# ---------------------------------------------------------------------------------------------------------
# Against TensorFlow itself (skipped where TensorFlow is absent, as on trainer hosts).


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


TF_FEATURES = {
    "inputs": np.array([0, 1, 127, 128, 32099, 16384, 2**31 - 1], dtype=np.int64),
    "big": np.array([INT64.min, -1, INT64.max, 2**40], dtype=np.int64),
    "weights": np.array([0.25, -1e30, 3.5, np.inf], dtype=np.float32),
    "text": [b"hello", b"", "\u00e9t\u00e9".encode()],
    "empty": np.zeros(0, dtype=np.int64),
}


def _tf_example(tf, features):
    feature = {}
    for name, value in features.items():
        value = _canonical(value)
        if isinstance(value, list):
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=value))
        elif value.dtype.kind == "f":
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=value.tolist()))
        else:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=value.tolist()))
    return tf.train.Example(features=tf.train.Features(feature=feature))


@pytest.mark.slow
def test_our_bytes_equal_tensorflows_and_parse_in_tensorflow_to_the_same_values(tf):
    ours = example_codec.encode_example(TF_FEATURES)
    assert ours == _tf_example(tf, TF_FEATURES).SerializeToString(deterministic=True)
    spec = {
        "inputs": tf.io.VarLenFeature(tf.int64),
        "big": tf.io.VarLenFeature(tf.int64),
        "weights": tf.io.VarLenFeature(tf.float32),
        "text": tf.io.VarLenFeature(tf.string),
        "empty": tf.io.VarLenFeature(tf.int64),
    }
    parsed = tf.io.parse_single_example(ours, spec)
    for name, value in TF_FEATURES.items():
        got = parsed[name].values.numpy()
        if isinstance(value, list):
            assert got.tolist() == value
        else:
            np.testing.assert_array_equal(got, value)


@pytest.mark.slow
def test_tensorflow_serializations_decode_to_the_same_values(tf):
    example = _tf_example(tf, TF_FEATURES)
    # Non-deterministic serialization: map entries in whatever order protobuf chose.
    for data in (example.SerializeToString(), example.SerializeToString(deterministic=True)):
        assert_same(example_codec.decode_example(data), TF_FEATURES)
        batch = example_codec.decode_batch(
            [data, data], {"inputs": "int32", "text": "string", "big": "int64"}
        )
        assert batch["inputs"].values.tolist() == TF_FEATURES["inputs"].tolist() * 2
        assert batch["big"].values.tolist() == TF_FEATURES["big"].tolist() * 2
        assert batch["text"].values == TF_FEATURES["text"] * 2


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.one_of(cache_records(), any_int_arrays().map(lambda a: {"ids": a})))
def test_our_bytes_equal_tensorflows_for_random_records(tf, record):
    ours = example_codec.encode_example(record)
    example = _tf_example(tf, record)
    theirs = example.SerializeToString(deterministic=True)
    if any(a != b and b.startswith(a) for a in record for b in record):
        # upb writes a name after the names it is a prefix of; the message is the same.
        assert tf.train.Example.FromString(ours) == example
        assert sorted(_map_entries(ours)) == sorted(_map_entries(theirs))
    else:
        assert ours == theirs


def _map_entries(record: bytes) -> list[bytes]:
    """The serialized Features map entries of a record, in stored order."""
    [(_, _, start, end)] = wire._iter_fields(record, 0, len(record), "Example")
    return [record[s:e] for _, _, s, e in wire._iter_fields(record, start, end, "Features")]


@pytest.mark.slow
def test_upb_orders_names_after_the_names_they_prefix_and_we_sort_bytewise(tf):
    # Pins the one known difference from TensorFlow's default runtime, on the cache job's own names.
    record = {"provenance/source_shard": "c4-train.00000-of-01024.json", "provenance/source_shard_index": [3]}
    theirs = _tf_example(tf, record).SerializeToString(deterministic=True)
    ours = example_codec.encode_example(record)
    assert ours == _reference_encode(record)
    assert ours.index(b"provenance/source_shard\x12") < ours.index(b"provenance/source_shard_index")
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() == "upb":
        assert theirs.index(b"provenance/source_shard_index") < theirs.index(b"provenance/source_shard\x12")
    else:
        assert theirs == ours
