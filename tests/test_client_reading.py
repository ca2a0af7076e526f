"""BatchReader: the host batch equals one read example by example, and every disagreement with the cache
is an error."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from taskdata.cache.format import CacheFormatError
from taskdata.cache.reader import CacheReader
from taskdata.cache.tfrecord import CorruptRecordError
from taskdata.example import pad_features
from taskdata.index import CacheFiles, TaskReads, assign
from taskdata.runs import CacheResolver, RunStore
from tests.client_helpers import LENGTHS, shared_root
from trainer_client.assignments import AssignmentError, HostSlice
from trainer_client.local_source import LocalAssignments
from trainer_client.reading import BatchReader
from trainer_client.shard_table import CacheReaderTable

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def source_and_reader(root, run="mix4"):
    source = LocalAssignments.from_cache_root(RunStore(root).get(run), root)
    return source, BatchReader(source.run_info(), LENGTHS)


def reference_features(readers, plan, step, index, count):
    """The host batch read one example at a time from ``assign``'s examples (no read instructions)."""
    examples = assign(plan, step, index, count).examples
    records = [readers[e.task].read_records("train", [e.shard], [e.record])[0] for e in examples]
    decoded = readers[plan.task_names[0]].decode(records, {name: "int32" for name in LENGTHS})
    return pad_features(decoded, LENGTHS)


def test_host_batches_equal_the_examples_read_one_by_one(root):
    source, reader = source_and_reader(root)
    plan = source.run_info().plan
    caches = CacheResolver(root).resolve_run(RunStore(root).get("mix4"))
    readers = {c.task: CacheReader(c.version_dir) for c in caches}
    for step in (0, 1, 29, 30, 333, 10**6):
        for index, count in [(d, 4) for d in range(4)] + [(1, 2), (0, 1)]:
            batch = reader.read(source.fetch(step, 1, HostSlice(index, count))[0])
            expected = reference_features(readers, plan, step, index, count)
            assert batch.positions == assign(plan, step, index, count).positions and not batch.skipped
            for name in LENGTHS:
                assert batch.features[name].dtype == np.int32
                assert np.array_equal(batch.features[name], expected[name]), (step, index, count, name)


def with_task(step_reads, t, *, columns=None, uris=None):
    """``step_reads`` with task ``t``'s read columns or file URIs replaced."""
    task = step_reads.tasks[t]
    cache = task.cache if uris is None else CacheFiles(task.task, task.version, task.files, uris)
    changed = TaskReads(cache, task.files, task.columns if columns is None else columns)
    return dataclasses.replace(step_reads, tasks=(*step_reads.tasks[:t], changed, *step_reads.tasks[t + 1 :]))


def test_padding_is_zero_and_token_count_excludes_it(root):
    source, reader = source_and_reader(root)
    batch = reader.read(source.fetch(3, 1, HostSlice(0, 1))[0])
    assert batch.features["inputs"].shape == (16, LENGTHS["inputs"])
    assert batch.features["targets"].shape == (16, LENGTHS["targets"])
    assert batch.num_tokens == sum(int((a != 0).sum()) for a in batch.features.values())
    assert batch.num_tokens < 16 * sum(LENGTHS.values())


def test_an_example_longer_than_its_length_is_an_error_naming_the_fix(root):
    source = LocalAssignments.from_cache_root(RunStore(root).get("mix4"), root)
    reader = BatchReader(source.run_info(), {"inputs": 8, "targets": 4})
    with pytest.raises(
        ValueError,
        match=r"Step 0: Feature 'targets' has an example of \d+ tokens, longer than 4\. "
        "Raise that feature's length",
    ):
        reader.read(source.fetch(0, 1, HostSlice(0, 4))[0])


def _one_version(root):
    source = LocalAssignments.from_cache_root(RunStore(root).get("mix4"), root)
    version_dir = next(iter(source.readers))
    reader = CacheReader(version_dir)
    return version_dir, reader, CacheReaderTable(reader, "train")


def test_a_reader_tables_byte_ranges_are_its_sidecars_whatever_shards_were_loaded_before(root):
    """The table keeps the offsets of the shards loaded so far end to end, adding shards as calls need them:
    every answer is the sidecars' own, and a shard is loaded when a read needs it, not before."""
    version_dir, reader, table = _one_version(root)
    sidecars = CacheReader(version_dir)
    counts = np.array(reader.record_counts("train"), np.int64)
    assert len(counts) == 3
    rng = np.random.default_rng(0)
    for among in ([1], [1], [2, 0], [0, 1, 2], []):
        shards = rng.choice(np.array(among, np.int64), 20) if among else np.zeros(0, np.int64)
        firsts = rng.integers(0, counts[shards] + 1)
        lengths = rng.integers(0, counts[shards] - firsts + 1)
        starts, sizes = table.byte_ranges(shards, firsts, lengths)
        assert starts.dtype == sizes.dtype == np.int64 and len(starts) == len(sizes) == len(shards)
        for shard, first, length, start, size in zip(shards, firsts, lengths, starts, sizes, strict=True):
            offsets = sidecars.shard_offsets("train", int(shard))
            assert (start, size) == (offsets[first], offsets[first + length] - offsets[first]), (shard, first, length)
        if among == [1]:
            assert not reader.offsets_loaded("train")  # shards 0 and 2 not read yet
    assert reader.offsets_loaded("train")


def test_a_reader_table_names_a_read_outside_its_shard_and_a_shard_that_is_not_there(root):
    _, reader, table = _one_version(root)
    records = reader.record_counts("train")[1]
    with pytest.raises(IndexError, match=rf"Records 5\.\.{records + 4} of shard 1 of task 'toy_\w+' are outside it: it "
                                         rf"has {records} records \(\S+train\S+\)"):
        table.byte_ranges(np.array([0, 1]), np.array([0, 5]), np.array([1, records]))
    for shard in (3, -1):
        with pytest.raises(IndexError, match=rf"Shard {shard} of task 'toy_\w+' does not exist: its version \S+ has 3 "
                                             "shards"):
            table.byte_ranges(np.array([0, shard]), np.array([0, 0]), np.array([1, 1]))
    assert not reader.offsets_loaded("train") and table.byte_ranges(np.array([2]), np.array([0]), np.array([0]))[1][0] == 0


def test_byte_ranges_that_disagree_with_the_offsets_sidecar_are_refused(root):
    source, reader = source_and_reader(root)
    step = source.fetch(0, 1, HostSlice(0, 4))[0]
    moved = step.tasks[1].columns.copy()
    moved[3, 0] += 1  # byte_offset of the first read
    with pytest.raises(
        AssignmentError, match=r"verified offsets give \d+\+\d+\. The instructions were made for other"
    ):
        reader.read(with_task(step, 1, columns=moved))
    beyond = step.tasks[1].columns.copy()
    beyond[1, 0] += 1000  # first_record: records past the shard's end
    with pytest.raises(
        AssignmentError, match=r"Step 0: Shard \S+ has \d+ records; record \d+ is out of range\. .* made for other bytes"
    ):
        reader.read(with_task(step, 1, columns=beyond))


def test_a_uri_that_is_not_the_named_shard_is_refused(root):
    source, reader = source_and_reader(root)
    step = source.fetch(0, 1, HostSlice(0, 4))[0]
    task = step.tasks[1]
    assert task.files.tolist() == [0]
    with pytest.raises(
        AssignmentError, match="as shard 0 of task 'toy_random', but its version folder .* holds as shard 0 \\S+-00000-of-00003\\."
    ):
        reader.read(with_task(step, 1, uris=(task.cache.uri(1),)))  # shard 1's file named as shard 0


def test_a_cache_with_other_bytes_than_the_plan_pins_is_refused(tmp_path, root):
    from tests.cache_helpers import build

    source, reader = source_and_reader(root)
    step = source.fetch(0, 1, HostSlice(0, 4))[0]
    task = step.tasks[0]
    # The same task rebuilt with another seed: the same folder layout, other bytes.
    reseeded = build(str(tmp_path), task="toy_det", num_shards=3, seed=1).version_dir
    moved = tuple(reseeded + "/" + uri.rsplit("/", 1)[1] for uri in task.file_uris)
    with pytest.raises(CacheFormatError, match="but the run plan names version"):
        reader.read(with_task(step, 0, uris=moved))


def test_a_flipped_byte_is_an_error_naming_shard_record_and_offset(tmp_path, root):
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    source, reader = source_and_reader(str(copy))
    step = source.fetch(0, 1, HostSlice(0, 1))[0]
    task = step.tasks[0]
    with open(task.cache.uri(int(task.shard[0])), "r+b") as f:
        f.seek(int(task.byte_offset[0] + task.byte_length[0]) - 6)  # inside the read's last record's payload
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(CorruptRecordError, match=r"train\.tfrecord-00000-of-00003.*record \d+.*offset \d+"):
        reader.read(step)


def test_a_block_order_run_reads_each_read_with_one_request_within_the_stated_bound(root, monkeypatch):
    # Later epochs of a block-order run: the host batch is still exactly the examples read one by one, the
    # reads per step stay within the plan's bound, and the client makes at most one ranged request per read.
    import taskdata.cache.reader as reader_module
    from taskdata.index import BlockOrder, reads_bound
    from taskdata.runs import StoredRun

    plan = dataclasses.replace(RunStore(root).get("mix4").plan, name="blocks", epoch_order=BlockOrder(4))
    source = LocalAssignments.from_cache_root(StoredRun(plan), root)
    reader = BatchReader(source.run_info(), LENGTHS)
    caches = CacheResolver(root).resolve_run(RunStore(root).get("mix4"))
    readers = {c.task: CacheReader(c.version_dir) for c in caches}
    requests: list[int] = []
    real_read_at = reader_module._read_at

    def counting(fd, begin, size):
        requests.append(1)
        return real_read_at(fd, begin, size)

    monkeypatch.setattr(reader_module, "_read_at", counting)
    bound = reads_bound(plan, 4)
    for step in (0, 30, 333, 10**6):
        for index in range(4):
            step_reads = source.fetch(step, 1, HostSlice(index, 4))[0]
            reads = sum(len(task) for task in step_reads.tasks)
            requests.clear()
            batch = reader.read(step_reads)
            assert reads <= bound and sum(requests) <= reads, (step, index, reads, requests)
            expected = reference_features(readers, plan, step, index, 4)
            for name in LENGTHS:
                assert np.array_equal(batch.features[name], expected[name]), (step, index, name)
    reader.close()
    source.close()


def test_the_generic_decoder_behind_the_fast_path_gives_the_same_batches(root, monkeypatch):
    # Batches of records that decode_padded refuses are decoded by the generic path: same bytes.
    source, reader = source_and_reader(root)
    steps = source.fetch(0, 40, HostSlice(0, 2))
    fast = [reader.read(step_reads) for step_reads in steps]
    refused = []
    monkeypatch.setattr("trainer_client.reading.decode_padded", lambda *args: refused.append(1))
    generic = [reader.read(step_reads) for step_reads in steps]
    assert len(refused) == 40
    for a, b in zip(fast, generic, strict=True):
        assert a.features.keys() == b.features.keys()
        assert all(a.features[name].tobytes() == b.features[name].tobytes() for name in a.features)


def test_a_batch_read_into_given_arrays_is_the_same_by_either_decoder(root, monkeypatch):
    # A read worker passes an allocator whose arrays lie in the memory it shares with the iterator: the batch
    # is decoded into exactly those (whatever they held), by the fast path or the generic one.
    source, reader = source_and_reader(root)
    steps = source.fetch(0, 12, HostSlice(0, 2))
    plain = [reader.read(step_reads) for step_reads in steps]
    given: dict[str, np.ndarray] = {}

    def into(name, rows, length):
        given[name] = np.full((rows, length), -1, dtype=np.int32)  # garbage the decoder must overwrite
        return given[name]

    for decoder in ("fast", "generic"):
        if decoder == "generic":
            monkeypatch.setattr("trainer_client.reading.decode_padded", lambda *args: None)
        for step_reads, expected in zip(steps, plain, strict=True):
            batch = reader.read(step_reads, into)
            assert all(batch.features[name] is given[name] for name in batch.features), decoder
            assert batch.features.keys() == expected.features.keys()
            assert all(batch.features[n].tobytes() == expected.features[n].tobytes() for n in expected.features)
    reader.close()
    source.close()
