"""Verified ranged reads of one shard through its offsets sidecar, and whole-shard verification."""

from __future__ import annotations

import hashlib
import io
import uuid

import numpy as np
import pytest

from taskdata import example as example_codec
from taskdata import fs
from taskdata.cache import tfrecord
from taskdata.cache.shard_reader import ShardReader, ShardSummary, verify_shard
from taskdata.cache.tfrecord import CorruptRecordError

SPEC = {"inputs": "int32", "targets": "int32", "_task": "string", "_index": "int64"}


def _rows(count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "inputs": rng.integers(0, 32100, int(rng.integers(1, 40)), dtype=np.int32),
            "targets": rng.integers(0, 32100, int(rng.integers(1, 12)), dtype=np.int32),
            "_task": "c4_span_corruption",
            "_index": i,
        }
        for i in range(count)
    ]


def _write(path: str, records: list[bytes]) -> tfrecord.RecordIndex:
    out = io.BytesIO()
    writer = tfrecord.TFRecordWriter(out)
    for record in records:
        writer.write(record)
    with fs.open_file(path, "wb") as f:
        f.write(out.getvalue())
    return tfrecord.read_record_index(writer.offsets_sidecar(), f"{path}.offsets")


@pytest.fixture
def shard(tmp_path):
    records = [example_codec.encode_example(r) for r in _rows(12)]
    path = str(tmp_path / "train.tfrecord-00000-of-00001")
    return path, records, _write(path, records)


def test_any_range_reads_back_exactly_the_records_written(shard):
    path, records, index = shard
    with ShardReader(path, index, max_record_bytes=1 << 20) as reader:
        assert reader.num_records == 12
        for first in range(13):
            for count in range(13 - first):
                assert reader.read(first, count) == records[first : first + count]


def test_read_batch_decodes_the_range_like_decode_batch(shard):
    path, records, index = shard
    with ShardReader(path, index, max_record_bytes=1 << 20) as reader:
        batch = reader.read_batch(5, 6, SPEC)
    expected = example_codec.decode_batch(records[5:11], SPEC)
    for name in SPEC:
        assert batch[name].row_splits.tolist() == expected[name].row_splits.tolist()
        assert np.asarray(batch[name].values).tolist() == np.asarray(expected[name].values).tolist()
    assert batch["_index"].values.tolist() == list(range(5, 11))


def test_reads_go_through_fsspec_so_any_filesystem_works():
    path = f"memory://taskdata-tests/{uuid.uuid4().hex}/train.tfrecord-00000-of-00001"
    records = [example_codec.encode_example(r) for r in _rows(5)]
    index = _write(path, records)
    with ShardReader(path, index, max_record_bytes=1 << 20) as reader:
        assert reader.read(3, 2) == records[3:]
    assert verify_shard(path, index, 5).records == 5


def test_a_range_outside_the_shard_is_an_index_error_naming_the_shard(shard):
    path, _, index = shard
    reader = ShardReader(path, index, max_record_bytes=1 << 20)
    with pytest.raises(IndexError, match=r"has 12 records; records \[10, 13\) are out of range"):
        reader.read(10, 3)
    with pytest.raises(ValueError, match="first must be a non-negative integer but got -1"):
        reader.read(-1, 1)


def test_every_single_byte_flip_is_an_error_naming_the_record_and_its_offset(tmp_path):
    records = [example_codec.encode_example(r) for r in _rows(3)]
    path = str(tmp_path / "s")
    index = _write(path, records)
    offsets = index.offsets
    clean = fs.read_bytes(path)
    for position in range(len(clean)):
        damaged = bytearray(clean)
        damaged[position] ^= 0x20
        with open(path, "wb") as f:
            f.write(bytes(damaged))
        record = int(np.searchsorted(offsets, position, side="right")) - 1
        for read in (lambda r: r.read(0, 3), lambda r: r.read_batch(0, 3, SPEC)):
            with (
                ShardReader(path, index, max_record_bytes=1 << 20) as reader,
                pytest.raises(CorruptRecordError) as caught,
            ):
                read(reader)
            assert (caught.value.record_index, caught.value.byte_offset) == (record, offsets[record]), (
                position
            )


def test_a_truncated_shard_names_the_first_incomplete_record(shard):
    path, _, index = shard
    offsets = index.offsets
    with open(path, "r+b") as f:
        f.truncate(int(offsets[7]) + 5)
    with ShardReader(path, index, max_record_bytes=1 << 20) as reader:
        assert len(reader.read(0, 7)) == 7
        with pytest.raises(CorruptRecordError, match="truncated shard") as caught:
            reader.read(4, 6)
    assert (caught.value.record_index, caught.value.byte_offset) == (7, offsets[7])
    with pytest.raises(CorruptRecordError, match="record 7 at byte offset"):
        verify_shard(path, index, 12)


def test_the_sidecar_of_another_shard_is_detected(tmp_path, shard):
    path, _, _ = shard
    other = [example_codec.encode_example(r) for r in _rows(12, seed=1)]
    wrong_index = _write(str(tmp_path / "other"), other)
    with (
        ShardReader(path, wrong_index, max_record_bytes=1 << 20, verify_crc=False) as reader,
        pytest.raises(CorruptRecordError, match="length field says") as caught,
    ):
        reader.read(0, 12)
    assert caught.value.record_index == 0


def test_records_longer_than_the_maximum_are_rejected(shard):
    path, records, index = shard
    longest = max(range(12), key=lambda i: len(records[i]))
    with (
        ShardReader(path, index, max_record_bytes=len(records[longest]) - 1) as reader,
        pytest.raises(CorruptRecordError, match="exceeds the maximum") as caught,
    ):
        reader.read(0, 12)
    assert caught.value.record_index == min(i for i in range(12) if len(records[i]) == len(records[longest]))


def test_a_record_with_valid_crcs_that_is_not_an_example_is_reported_with_its_position(tmp_path):
    records = [example_codec.encode_example(r) for r in _rows(4)]
    records[2] = b"\x0b not a protobuf"
    path = str(tmp_path / "s")
    index = _write(path, records)
    offsets = index.offsets
    with ShardReader(path, index, max_record_bytes=1 << 20) as reader:
        assert reader.read(0, 4)[2] == records[2]
        with pytest.raises(CorruptRecordError, match="it is not a valid example") as caught:
            reader.read_batch(1, 3, SPEC)
    assert (caught.value.record_index, caught.value.byte_offset) == (2, offsets[2])


def test_crc_checks_can_be_skipped_but_framing_is_still_checked(shard):
    path, records, index = shard
    offsets = index.offsets
    damaged = bytearray(fs.read_bytes(path))
    damaged[int(offsets[3]) + 20] ^= 0x01  # inside record 3's data
    with open(path, "wb") as f:
        f.write(bytes(damaged))
    with ShardReader(path, index, max_record_bytes=1 << 20, verify_crc=False) as reader:
        assert reader.read(3, 1) != records[3:4]
    with (
        ShardReader(path, index, max_record_bytes=1 << 20) as reader,
        pytest.raises(CorruptRecordError, match="record 3 at byte offset"),
    ):
        reader.read(3, 1)


def test_verify_shard_summarizes_a_good_shard(shard):
    path, _, index = shard
    offsets = index.offsets
    digest = hashlib.sha256(fs.read_bytes(path)).hexdigest()
    summary = verify_shard(path, index, 12, digest, max_record_bytes=1 << 20, chunk_bytes=100)
    assert summary == ShardSummary(path=path, records=12, size_bytes=int(offsets[-1]), sha256=digest)


def test_verify_shard_detects_every_kind_of_damage(shard):
    path, _, index = shard
    offsets = index.offsets
    digest = hashlib.sha256(fs.read_bytes(path)).hexdigest()
    with pytest.raises(ValueError, match="lists 12 records but the manifest expects 13"):
        verify_shard(path, index, 13)
    with pytest.raises(ValueError, match=f"its sha256 is {digest} but the manifest says {'0' * 64}"):
        verify_shard(path, index, 12, "0" * 64)
    with open(path, "ab") as f:
        f.write(tfrecord.frame_record(b"an extra record"))
    with pytest.raises(CorruptRecordError, match="continues past the end") as caught:
        verify_shard(path, index, 12)
    assert (caught.value.record_index, caught.value.byte_offset) == (12, offsets[-1])
    fs_path = path + ".missing"
    with pytest.raises(FileNotFoundError):
        verify_shard(fs_path, index, 12)


def test_verify_shard_finds_a_flipped_byte_in_any_chunk(shard):
    path, _, index = shard
    offsets = index.offsets
    clean = fs.read_bytes(path)
    for record in (0, 6, 11):
        damaged = bytearray(clean)
        damaged[int(offsets[record + 1]) - 1] ^= 0x80  # the last byte of the record's data CRC
        with open(path, "wb") as f:
            f.write(bytes(damaged))
        with pytest.raises(CorruptRecordError, match="CRC of the record data") as caught:
            verify_shard(path, index, 12, chunk_bytes=64)
        assert caught.value.record_index == record


def test_reader_and_summary_validate_their_arguments(shard):
    path, _, index = shard
    offsets = index.offsets
    with pytest.raises(ValueError, match="max_record_bytes must be a non-negative integer"):
        ShardReader(path, index, max_record_bytes=-1)
    with pytest.raises(TypeError, match="index must be a RecordIndex"):
        ShardReader(path, offsets, max_record_bytes=10)
    with pytest.raises(ValueError, match="must start at byte 0"):
        tfrecord.RecordIndex(np.array([5, 40]), np.array([0], dtype=np.uint32))
    with pytest.raises(ValueError, match="64 lowercase hex digits"):
        ShardSummary(path=path, records=1, size_bytes=1, sha256="abc")
