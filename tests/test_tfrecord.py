"""TFRecord framing, CRCs, sequential verified reading, vectorized frame checks and the offsets sidecar."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from taskdata.cache import tfrecord
from taskdata.cache.tfrecord import CorruptRecordError

PAYLOADS = [b"first record", b"", b"the third, a little longer record"]

# Recipe: `with tf.io.TFRecordWriter(p) as w: w.write(b"hi")`, then `open(p, "rb").read().hex()`
# (TensorFlow 2.21): length 2 as uint64 LE, masked CRC32C of those 8 bytes, b"hi", masked CRC32C of b"hi".
GOLDEN_HI = bytes.fromhex("020000000000000078270b34686913d60856")


def _shard(payloads=PAYLOADS) -> tuple[bytes, np.ndarray]:
    out = io.BytesIO()
    writer = tfrecord.TFRecordWriter(out)
    for payload in payloads:
        writer.write(payload)
    return out.getvalue(), tfrecord.read_offsets(writer.offsets_sidecar(), "sidecar")


def _crcs(payloads=PAYLOADS) -> np.ndarray:
    return np.array([tfrecord.masked_crc32c(p) for p in payloads], dtype=np.uint32)


def _record_containing(offsets: np.ndarray, byte: int) -> int:
    return int(np.searchsorted(offsets, byte, side="right")) - 1


def test_crc32c_matches_the_standard_check_value_and_tensorflows_masking():
    # 0xE3069283 is CRC-32C's published check value for b"123456789".
    crc = 0xE3069283
    assert (
        tfrecord.masked_crc32c(b"123456789")
        == ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) % 2**32
    )


def test_frame_of_a_tiny_record_is_byte_identical_to_tensorflows():
    assert tfrecord.frame_record(b"hi") == GOLDEN_HI


def test_writer_returns_and_collects_the_offset_of_every_record():
    out = io.BytesIO()
    writer = tfrecord.TFRecordWriter(out)
    returned = [writer.write(p) for p in PAYLOADS]
    expected = [0, 16 + len(PAYLOADS[0]), 32 + len(PAYLOADS[0])]
    assert returned == writer.offsets == expected
    assert writer.position == len(out.getvalue()) == sum(len(p) + 16 for p in PAYLOADS)
    assert out.getvalue() == b"".join(tfrecord.frame_record(p) for p in PAYLOADS)


def test_iter_records_round_trips_every_payload():
    data, _ = _shard()
    assert list(tfrecord.iter_records(io.BytesIO(data), "s")) == PAYLOADS
    assert list(tfrecord.iter_records(io.BytesIO(b""), "empty")) == []


def test_short_reads_from_the_file_object_are_not_mistaken_for_truncation():
    class Trickle(io.BytesIO):
        def read(self, size=-1):
            return super().read(min(size, 3) if size >= 0 else 3)

    data, _ = _shard()
    assert list(tfrecord.iter_records(Trickle(data), "s")) == PAYLOADS
    assert tfrecord.read_full(Trickle(b"abcdefgh"), 7) == b"abcdefg"
    assert tfrecord.read_full(Trickle(b"abc"), 7) == b"abc"


def test_every_single_byte_flip_is_detected_and_names_the_record_containing_it():
    data, offsets = _shard()
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x5A
        with pytest.raises(CorruptRecordError) as caught:
            list(tfrecord.iter_records(io.BytesIO(bytes(damaged)), "shard-0"))
        record = _record_containing(offsets, position)
        assert caught.value.record_index == record, position
        assert caught.value.byte_offset == offsets[record]


def test_every_single_byte_flip_is_detected_by_the_vectorized_frame_check():
    data, offsets = _shard()
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        with pytest.raises(CorruptRecordError) as caught:
            tfrecord.check_frames(
                bytes(damaged), offsets, path="shard-0", first_index=0, base_offset=0, max_record_bytes=None,
                expected_crcs=_crcs(),
            )
        assert caught.value.record_index == _record_containing(offsets, position), position


def test_truncation_anywhere_inside_a_record_names_that_record():
    data, offsets = _shard()
    for cut in range(1, len(data)):
        if cut in offsets:
            # A cut between frames leaves a valid, shorter file: only the sidecar or the count
            # (verify_shard, ShardReader) can tell, and those tests cover it.
            assert len(list(tfrecord.iter_records(io.BytesIO(data[:cut]), "s"))) == list(offsets).index(cut)
            continue
        with pytest.raises(CorruptRecordError, match="file ends inside") as caught:
            list(tfrecord.iter_records(io.BytesIO(data[:cut]), "s"))
        assert caught.value.record_index == _record_containing(offsets, cut)


def test_vectorized_check_reports_a_short_buffer_as_truncation_of_the_right_record():
    data, offsets = _shard()
    with pytest.raises(CorruptRecordError, match="truncated shard") as caught:
        tfrecord.check_frames(
            data[:-3], offsets, path="s", first_index=10, base_offset=1000, max_record_bytes=None,
            expected_crcs=_crcs(),
        )
    assert (caught.value.record_index, caught.value.byte_offset) == (12, 1000 + int(offsets[2]))
    assert caught.value.reason == (
        f"the file ends at byte {1000 + len(data) - 3}, inside this record, which the offset sidecar says ends "
        f"at byte {1000 + len(data)} (truncated shard)"
    )


def test_error_message_names_shard_record_offset_and_the_fix():
    data, offsets = _shard()
    damaged = bytearray(data)
    damaged[int(offsets[2]) + 14] ^= 0xFF
    with pytest.raises(CorruptRecordError) as caught:
        list(
            tfrecord.iter_records(
                io.BytesIO(bytes(damaged)), "gs://bucket/cache/train.tfrecord-00003-of-00064"
            )
        )
    assert str(caught.value) == (
        f"Corrupt TFRecord shard gs://bucket/cache/train.tfrecord-00003-of-00064: record 2 at byte offset "
        f"{int(offsets[2])}: the CRC of the record data does not match. The file is damaged or incomplete; run "
        "'taskdata verify' on the cache and rebuild it ('taskdata cache ... --force') if verification fails."
    )


def test_lengths_beyond_the_maximum_are_rejected_before_reading_the_data():
    data, offsets = _shard()
    with pytest.raises(CorruptRecordError, match="exceeds the maximum of 20 bytes") as caught:
        list(tfrecord.iter_records(io.BytesIO(data), "s", max_record_bytes=20))
    assert caught.value.record_index == 2
    with pytest.raises(CorruptRecordError, match="exceeds the maximum of 20 bytes"):
        tfrecord.check_frames(
            data, offsets, path="s", first_index=0, base_offset=0, max_record_bytes=20, expected_crcs=_crcs()
        )


def test_a_frame_that_disagrees_with_the_sidecar_is_reported_even_without_crc_checks():
    data, offsets = _shard()
    wrong = offsets.copy()
    wrong[1] += 1  # record 0 one byte longer, record 1 one shorter
    with pytest.raises(CorruptRecordError, match="sidecar says") as caught:
        tfrecord.check_frames(
            data, wrong, path="s", first_index=0, base_offset=0, max_record_bytes=None, verify_crc=False,
            expected_crcs=_crcs(),
        )
    assert caught.value.record_index == 0


def test_check_frames_returns_the_data_spans():
    data, offsets = _shard()
    starts, ends = tfrecord.check_frames(
        data, offsets, path="s", first_index=0, base_offset=0, max_record_bytes=64, expected_crcs=_crcs()
    )
    assert [data[s:e] for s, e in zip(starts, ends, strict=True)] == PAYLOADS


def test_offsets_sidecar_round_trips_and_is_read_only():
    sidecar = tfrecord.write_offsets([0, 20, 56], 100, [7, 2**32 - 1, 0])
    assert sidecar[:8] == b"TDOFFSET"
    assert len(sidecar) == 24 + 8 * 4 + 4 * 3
    index = tfrecord.read_record_index(sidecar, "s.offsets")
    assert index.offsets.tolist() == [0, 20, 56, 100] == tfrecord.read_offsets(sidecar, "s").tolist()
    assert index.crcs.tolist() == [7, 2**32 - 1, 0] and index.count == 3
    assert not index.offsets.flags.writeable and not index.crcs.flags.writeable
    empty = tfrecord.read_record_index(tfrecord.write_offsets([], 0, []), "empty")
    assert empty.offsets.tolist() == [0] and empty.crcs.tolist() == []


def test_the_writers_sidecar_lists_the_data_crc_stored_in_every_frame():
    out = io.BytesIO()
    writer = tfrecord.TFRecordWriter(out)
    for payload in PAYLOADS:
        writer.write(payload)
    index = tfrecord.read_record_index(writer.offsets_sidecar(), "s")
    data = out.getvalue()
    stored = [int.from_bytes(data[end - 4 : end], "little") for end in index.offsets[1:].tolist()]
    assert index.crcs.tolist() == stored == _crcs().tolist() == writer.crcs


def test_two_records_of_equal_length_swapped_are_caught_by_the_sidecar_crcs_even_without_crc_checks():
    payloads = [b"record A", b"record B", b"record C"]
    data, offsets = _shard(payloads)
    swapped, _ = _shard([payloads[0], payloads[2], payloads[1]])
    assert len(swapped) == len(data)
    for verify_crc in (True, False):
        with pytest.raises(CorruptRecordError, match="another record was moved here") as caught:
            tfrecord.check_frames(
                swapped, offsets, path="s", first_index=0, base_offset=0, max_record_bytes=None,
                expected_crcs=_crcs(payloads), verify_crc=verify_crc,
            )
        assert (caught.value.record_index, caught.value.byte_offset) == (1, int(offsets[1]))
        assert f"its data CRC is {tfrecord.masked_crc32c(b'record C'):#010x}" in caught.value.reason


def test_every_byte_flip_of_the_sidecar_is_rejected():
    sidecar = tfrecord.write_offsets([0, 20, 56], 100, [1, 2, 3])
    for position in range(len(sidecar)):
        damaged = bytearray(sidecar)
        damaged[position] ^= 0x10
        with pytest.raises(ValueError, match=r"s\.offsets"):
            tfrecord.read_offsets(bytes(damaged), "s.offsets")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b"NOTOFFST" + b[8:], "not a taskdata offsets file"),
        (lambda b: b[:10], "not a taskdata offsets file"),
        (lambda b: b[:8] + struct.pack("<I", 1) + b[12:], "format version 1; this taskdata reads version 2"),
        (lambda b: b[:-1], "fails its CRC32C"),
    ],
)
def test_sidecar_errors_say_what_is_wrong(mutate, message):
    with pytest.raises(ValueError, match=message):
        tfrecord.read_offsets(mutate(tfrecord.write_offsets([0, 20], 40, [1, 2])), "s.offsets")


def test_sidecar_with_a_valid_crc_but_impossible_offsets_is_rejected():
    import google_crc32c

    def forge(table, count=None):
        count = len(table) - 1 if count is None else count
        body = struct.pack("<Q", count) + np.asarray(table, "<u8").tobytes() + bytes(4 * (len(table) - 1))
        return b"TDOFFSET" + struct.pack("<II", 2, google_crc32c.value(body)) + body

    with pytest.raises(ValueError, match="must start at byte 0"):
        tfrecord.read_offsets(forge([4, 20, 40]), "s")
    with pytest.raises(ValueError, match="record 1 spans bytes \\[20, 30\\)"):
        tfrecord.read_offsets(forge([0, 20, 30]), "s")
    with pytest.raises(ValueError, match="holds 56 bytes but 3 records need 68"):
        tfrecord.read_offsets(forge([0, 20, 40], count=3), "s")


def test_write_offsets_refuses_offsets_that_cannot_be_a_tfrecord_file():
    with pytest.raises(ValueError, match="shorter than the 16-byte frame"):
        tfrecord.write_offsets([0, 10], 30, [0, 0])
    with pytest.raises(ValueError, match="needs as many 32-bit CRCs"):
        tfrecord.write_offsets([0, 20], 40, [0])


# ---------------------------------------------------------------------------------------------------------
# Against TensorFlow itself (skipped where TensorFlow is absent, as on trainer hosts).


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


TF_PAYLOADS = [b"", b"x", bytes(range(256)) * 40, b"\x00" * 70_000]


@pytest.mark.slow
def test_our_files_are_byte_identical_to_tensorflows_and_read_back_in_tensorflow(tf, tmp_path):
    theirs = tmp_path / "theirs.tfrecord"
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for payload in TF_PAYLOADS:
            writer.write(payload)
    ours, _ = _shard(TF_PAYLOADS)
    assert ours == theirs.read_bytes()
    mine = tmp_path / "ours.tfrecord"
    mine.write_bytes(ours)
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(mine))] == TF_PAYLOADS


@pytest.mark.slow
def test_files_written_by_tensorflow_pass_our_verification(tf, tmp_path):
    theirs = tmp_path / "theirs.tfrecord"
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for payload in TF_PAYLOADS:
            writer.write(payload)
    with open(theirs, "rb") as f:
        assert list(tfrecord.iter_records(f, str(theirs))) == TF_PAYLOADS


def test_the_vectorized_length_crc_equals_crc32c():
    import google_crc32c

    rows = np.random.default_rng(0).integers(0, 256, (500, 8), dtype=np.uint8)
    rows[0] = 0
    rows[1] = 255
    expected = [google_crc32c.value(bytes(row)) for row in rows]
    assert tfrecord._crc32c_rows(rows).tolist() == expected
