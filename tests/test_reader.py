"""The cache reader: O(1) seek, verified reads, identical with and without TensorFlow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from taskdata.cache.format import CacheFormatError
from taskdata.cache.reader import CacheReader, feature_spec
from taskdata.cache.tfrecord import CorruptRecordError
from tests.cache_helpers import build, sequential_records

pytestmark = pytest.mark.slow  # cache jobs (Beam)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return build(tmp_path_factory.mktemp("reader"), task="toy_random", num_shards=3).version_dir


def test_ranged_reads_equal_sequential_reads(cache):
    expected = sequential_records(cache)
    with CacheReader(cache) as reader:
        for shard, records in enumerate(expected):
            assert reader.read("train", shard, 0, len(records)) == records
            assert reader.read("train", shard, 5, 7) == records[5:12]
            assert reader.read("train", shard, len(records) - 1, 1) == records[-1:]


def test_read_records_in_any_order(cache):
    expected = sequential_records(cache)
    rng = np.random.default_rng(0)
    shards = rng.integers(0, 3, 200)
    records = [int(rng.integers(0, len(expected[s]))) for s in shards]
    with CacheReader(cache) as reader:
        assert reader.read_records("train", shards, records) == [expected[s][r] for s, r in zip(shards, records, strict=True)]


def test_offsets_loaded_says_whether_every_sidecar_of_the_split_is_loaded(cache):
    with CacheReader(cache) as reader:
        assert not reader.offsets_loaded("train")
        reader.load_offsets("train", [0, 2])
        assert not reader.offsets_loaded("train")
        reader.read_records("train", [1, 0], [0, 0])  # loads shard 1's
        assert reader.offsets_loaded("train")
        reader.close()
        assert not reader.offsets_loaded("train")


def test_decoded_features_match_tensorflow(cache):
    import json

    import tensorflow as tf

    reader = CacheReader(cache)
    info = json.loads(Path(cache, "info.train.json").read_text())
    description = {
        name: tf.io.VarLenFeature(tf.string if spec["dtype"] == "string" else tf.int64)
        for name, spec in info["features"].items()
    }
    files = [reader.shard_path("train", s) for s in range(3)]
    ours = reader.decode([r for shard in sequential_records(cache) for r in shard],
                         feature_spec(reader.manifest, include_provenance=True))
    parsed = tf.io.parse_example(tf.stack(list(tf.data.TFRecordDataset(files))), description)
    for name, ragged in ours.items():
        theirs = tf.RaggedTensor.from_sparse(parsed[name])
        assert np.array_equal(ragged.row_splits, theirs.row_splits.numpy()), name
        values = theirs.values.numpy()
        if name in ("inputs", "targets") or (name.startswith("provenance/") and values.dtype != object):
            assert np.array_equal(np.asarray(ragged.values, dtype=np.int64), values), name
        else:
            assert list(ragged.values) == list(values), name


def test_reader_works_without_tensorflow(cache):
    code = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "from taskdata.cache.reader import CacheReader\n"
        f"r = CacheReader({cache!r})\n"
        "records = r.read('train', 0, 0, 5)\n"
        "print(len(r.decode(records)['targets'].row_splits) - 1)\n"
        "assert 'tensorflow' not in sys.modules or sys.modules['tensorflow'] is None\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "5"


def test_decode_records_decodes_in_place_what_read_records_reads(cache):
    rng = np.random.default_rng(1)
    shards = rng.integers(0, 3, 300)
    with CacheReader(cache) as reader:
        records = [int(rng.integers(0, reader.record_counts("train")[s])) for s in shards]  # repeats too
        spec = feature_spec(reader.manifest, include_provenance=True)
        expected = reader.decode(reader.read_records("train", shards, records), spec)
        got = reader.decode_records("train", shards, records, spec)
        assert sorted(got) == sorted(expected) == ["inputs", "provenance/origin", "targets"]
        for name, feature in expected.items():
            np.testing.assert_array_equal(got[name].row_splits, feature.row_splits)
            np.testing.assert_array_equal(got[name].values, feature.values)
        assert len(reader.decode_records("train", [], [], spec)["targets"]) == 0


def test_corrupt_record_is_named_with_shard_record_and_offset(cache, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(cache, copy)
    reader = CacheReader(str(copy))
    offsets = reader.shard_offsets("train", 1)
    path = Path(reader.shard_path("train", 1))
    data = bytearray(path.read_bytes())
    data[int(offsets[4]) + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    fresh = CacheReader(str(copy))
    assert len(fresh.read("train", 1, 0, 4)) == 4  # records before the damage still read
    with pytest.raises(CorruptRecordError) as info:
        fresh.read("train", 1, 2, 5)
    assert (info.value.record_index, info.value.byte_offset) == (4, int(offsets[4]))
    assert str(path) in str(info.value)
    with pytest.raises(CorruptRecordError) as info:
        fresh.read_records("train", [1, 1, 0], [9, 4, 0])  # a scattered (gathered) read
    assert (info.value.record_index, info.value.byte_offset) == (4, int(offsets[4]))
    with pytest.raises(CorruptRecordError) as info:
        fresh.decode_records("train", [0, 1, 1], [0, 9, 4])  # decoded in place: verified all the same
    assert (info.value.record_index, info.value.byte_offset) == (4, int(offsets[4]))


def test_plan_for_other_bytes_is_refused(cache):
    with pytest.raises(CacheFormatError, match="the run plan names version 000000000000"):
        CacheReader(cache, expected_manifest_sha256="0" * 64)


def test_incomplete_version_is_refused(cache, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(cache, copy)
    (copy / "COMPLETED").unlink()
    with pytest.raises(CacheFormatError, match="no COMPLETED marker"):
        CacheReader(str(copy))


def test_out_of_range_reads_say_what_exists(cache):
    reader = CacheReader(cache)
    with pytest.raises(IndexError, match=r"has shards \[0, 3\); got 3"):
        reader.read("train", 3, 0, 1)
    count = reader.record_counts("train")[0]
    with pytest.raises(IndexError, match=f"has {count} records; records \\[{count - 1}, {count + 1}\\) are out of range"):
        reader.read("train", 0, count - 1, 2)


def _copy(cache, tmp_path) -> Path:
    import shutil

    copy = tmp_path / "copy" / Path(cache).name
    shutil.copytree(cache, copy)
    return copy


def test_a_shard_truncated_under_an_open_reader_is_a_corrupt_record_error_not_a_bus_error(cache, tmp_path):
    from taskdata.cache.verify import verify_version

    copy = _copy(cache, tmp_path)
    # In a child process: a memory-mapped shard cut short under the reader kills it with SIGBUS.
    code = (
        "import os\n"
        "from taskdata.cache.reader import CacheReader\n"
        "from taskdata.cache.tfrecord import CorruptRecordError\n"
        f"reader = CacheReader({str(copy)!r})\n"
        "n = reader.record_counts('train')[1]\n"
        "reader.read_records('train', [1] * n, list(range(n)))\n"
        "offsets = reader.shard_offsets('train', 1)\n"
        "os.truncate(reader.shard_path('train', 1), int(offsets[2]) + 5)\n"
        "try:\n"
        "    reader.read_records('train', [1] * n, list(range(n)))\n"
        "except CorruptRecordError as e:\n"
        "    print(f'{e.record_index}|{e.byte_offset}|{e.reason}')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    offsets = CacheReader(str(copy)).shard_offsets("train", 1)
    reason = (f"the file ends at byte {int(offsets[2]) + 5}, inside this record, which the offset sidecar says "
              f"ends at byte {int(offsets[3])} (truncated shard)")
    assert out.stdout.strip() == f"2|{int(offsets[2])}|{reason}"
    assert verify_version(str(copy)) == [f"shard train.tfrecord-00001-of-00003: record 2 at byte offset "
                                         f"{int(offsets[2])}: {reason}"]


def test_truncation_in_a_scattered_read_is_reported_with_the_files_positions_as_verify_does(cache, tmp_path):
    from taskdata.cache.verify import verify_version

    copy = _copy(cache, tmp_path)
    reader = CacheReader(str(copy))
    offsets = reader.shard_offsets("train", 2)
    cut = int(offsets[10]) + 7
    os.truncate(reader.shard_path("train", 2), cut)
    fresh = CacheReader(str(copy))
    for read in (lambda: fresh.read_records("train", [2, 2, 2, 2, 2, 0], [5, 3, 9, 10, 11, 1]),
                 lambda: fresh.read("train", 2, 8, 3)):
        with pytest.raises(CorruptRecordError) as info:
            read()
        problem = (f"shard train.tfrecord-00002-of-00003: record {info.value.record_index} at byte offset "
                   f"{info.value.byte_offset}: {info.value.reason}")
        assert [problem] == verify_version(str(copy))
        assert f"the file ends at byte {cut}, inside this record, which the offset sidecar says ends at byte " \
               f"{int(offsets[11])}" in problem
    with pytest.raises(CorruptRecordError) as info:
        fresh.read_records("train", [2], [12])  # wholly past the cut
    assert (info.value.record_index, info.value.byte_offset) == (12, int(offsets[12]))
    assert info.value.reason.startswith(f"the file ends at byte {cut}, before this record")


def _equal_length_pair(offsets: np.ndarray) -> tuple[int, int]:
    sizes = np.diff(offsets)
    for i in range(len(sizes)):
        for j in range(i + 2, len(sizes)):
            if sizes[i] == sizes[j]:
                return i, j
    raise AssertionError("no two records of equal length in this shard")


def test_two_equal_length_records_swapped_inside_a_shard_are_an_error_naming_the_record(cache, tmp_path):
    from taskdata.cache.verify import verify_version

    copy = _copy(cache, tmp_path)
    reader = CacheReader(str(copy))
    offsets = reader.shard_offsets("train", 0)
    i, j = _equal_length_pair(offsets)
    path = Path(reader.shard_path("train", 0))
    data = bytearray(path.read_bytes())
    a, b = slice(int(offsets[i]), int(offsets[i + 1])), slice(int(offsets[j]), int(offsets[j + 1]))
    data[a], data[b] = data[b], data[a]
    path.write_bytes(bytes(data))
    for verify_crc in (True, False):
        fresh = CacheReader(str(copy), verify_crc=verify_crc)
        assert len(fresh.read("train", 0, 0, i)) == i  # the records before it still read
        for read in (lambda r=fresh: r.read("train", 0, 0, j + 1),
                     lambda r=fresh: r.read_records("train", [0, 0], [j, i])):
            with pytest.raises(CorruptRecordError, match="another record was moved here") as info:
                read()
            assert (info.value.record_index, info.value.byte_offset) == (i, int(offsets[i]))
        with pytest.raises(CorruptRecordError) as info:
            fresh.read_records("train", [0], [j])
        assert (info.value.record_index, info.value.byte_offset) == (j, int(offsets[j]))
    [problem] = verify_version(str(copy))
    assert problem.startswith(f"shard train.tfrecord-00000-of-00003: record {i} at byte offset {int(offsets[i])}: "
                              "its data CRC is ")
