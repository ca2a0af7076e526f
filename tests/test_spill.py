"""Spill files between the cache job's stages: sorted runs, read back in chunks, merged by key."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from taskdata.beam.spill import Segment, SpillWriter, merge_segments, read_segment
from taskdata.cache.shuffle import shard_of_key


def _spilled(tmp_path, pairs, num_shards=3, buffer_bytes=1 << 20, name="src"):
    writer = SpillWriter(str(tmp_path / name), num_shards, buffer_bytes)
    for key, record in pairs:
        writer.add(key, record)
    return writer.close()


def _pairs(n, seed):
    rng = random.Random(seed)
    return [(rng.getrandbits(64), os.urandom(rng.choice([0, 1, 7, 300, 5000]))) for _ in range(n)]


@pytest.mark.parametrize("chunk_bytes", [1, 13, 4096, 1 << 20])
def test_a_segment_reads_back_the_same_in_chunks_of_any_size(tmp_path, chunk_bytes):
    pairs = _pairs(300, seed=1)
    for dest, segment in _spilled(tmp_path, pairs):
        expected = sorted((k, r) for k, r in pairs if shard_of_key(k, 3) == dest)
        assert list(read_segment(segment, chunk_bytes)) == expected


def test_merged_segments_are_every_entry_in_key_order_whatever_the_chunk_budget(tmp_path):
    # Three source shards, each spilled in several sorted runs (a small buffer), then one shard's merge.
    segments, pairs = [], []
    for source in range(3):
        mine = _pairs(400, seed=10 + source)
        pairs += mine
        segments += [s for d, s in _spilled(tmp_path, mine, buffer_bytes=50_000, name=f"s{source}") if d == 1]
    assert len(segments) > 3
    expected = sorted((k, r) for k, r in pairs if shard_of_key(k, 3) == 1)
    for budget in (1, 1 << 20):
        assert list(merge_segments(segments, budget)) == expected


def test_equal_keys_merge_in_the_order_of_the_segments(tmp_path):
    a = _spilled(tmp_path, [(5, b"a1"), (9, b"a2")], num_shards=1, name="a")[0][1]
    b = _spilled(tmp_path, [(5, b"b1"), (7, b"b2")], num_shards=1, name="b")[0][1]
    assert [r for _, r in merge_segments([a, b])] == [b"a1", b"b1", b"b2", b"a2"]
    assert [r for _, r in merge_segments([b, a])] == [b"b1", b"a1", b"b2", b"a2"]


def test_a_truncated_spill_file_is_an_error_naming_it(tmp_path):
    (_, segment), = _spilled(tmp_path, [(1, b"x" * 100), (2, b"y" * 100)], num_shards=1)
    with open(segment.path, "r+b") as f:
        f.truncate(150)
    with pytest.raises(OSError, match=r"is shorter than expected \(150 bytes read of 224 at offset 0\)"):
        list(read_segment(segment, chunk_bytes=64))


def test_a_segment_with_more_bytes_than_its_entries_is_corrupt(tmp_path):
    (_, segment), = _spilled(tmp_path, [(1, b"x" * 10), (2, b"y" * 10)], num_shards=1)
    one_entry = Segment(segment.path, segment.start, segment.end, 1)
    with pytest.raises(OSError, match="holds 22 trailing bytes: it is corrupt"):
        list(read_segment(one_entry, chunk_bytes=8))
    short_count = Segment(segment.path, segment.start, segment.start + 20, 1)
    with pytest.raises(OSError, match="ends inside an entry: it is corrupt"):
        list(read_segment(short_count))


def test_a_duplicate_key_found_while_a_shard_streams_in_leaves_no_half_written_file(tmp_path):
    from taskdata.beam.pipeline import CacheJobSpec, write_output_shard
    from taskdata.example import encode_example

    version = tmp_path / "v"
    spec = CacheJobSpec(task="toy", task_fingerprint="x", modules=(), config=("/tmp", None, None), seed=0,
                        version_dir=str(version), tmp_dir=str(version / "_tmp"), num_shards=(("train", 1),))
    records = [(k, encode_example({"inputs": np.arange(k % 50, dtype=np.int32), "provenance/origin": [0, k, k, 0]}))
               for k in range(1, 2000)]
    segments = [s.to_tuple() for _, s in _spilled(tmp_path, [*records, (1500, records[0][1])], num_shards=1)]
    with pytest.raises(RuntimeError, match="same shuffle key"):
        write_output_shard(spec, "train", 0, segments)
    # Nothing in the version; the job's temporary folder (removed at the commit) holds no partial file either.
    assert os.listdir(version) == ["_tmp"] and os.listdir(version / "_tmp" / "writing") == []
    # Negative control: without the duplicate, the same call writes the shard and its offsets.
    write_output_shard(spec, "train", 0, [s.to_tuple() for _, s in _spilled(tmp_path, records, num_shards=1)])
    assert sorted(os.listdir(version)) == ["_tmp", "index", "train.tfrecord-00000-of-00001"]


def test_each_destination_starts_at_the_first_key_shard_of_key_gives_it():
    from taskdata.beam.spill import _first_keys
    from taskdata.cache.shuffle import shard_of_key

    for num_shards in (1, 2, 3, 7, 1000, 65536):
        firsts = _first_keys(num_shards).tolist()
        assert firsts[0] == 0 and len(firsts) == num_shards
        for dest, key in enumerate(firsts):
            assert shard_of_key(key, num_shards) == dest
            if dest:
                assert shard_of_key(key - 1, num_shards) == dest - 1
