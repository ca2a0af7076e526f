"""BatchReader: the host batch equals taskdata.stream's, and every disagreement with the cache is an error."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from taskdata.cache.format import CacheFormatError
from taskdata.cache.reader import CacheReader
from taskdata.cache.tfrecord import CorruptRecordError
from taskdata.runs import CacheResolver, RunStore
from taskdata.stream import RunReader
from tests.client_helpers import LENGTHS, shared_root
from trainer_client.assignments import AssignmentError, HostSlice
from trainer_client.local_source import LocalAssignments
from trainer_client.reading import BatchReader


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def source_and_reader(root, run="mix4"):
    source = LocalAssignments.from_cache_root(RunStore(root).get(run), root)
    return source, BatchReader(source.run_info(), LENGTHS)


def test_host_batches_equal_the_run_stream_readers(root):
    source, reader = source_and_reader(root)
    plan = source.run_info().plan
    caches = CacheResolver(root).resolve_run(RunStore(root).get("mix4"))
    stream = RunReader(plan, {c.task: CacheReader(c.version_dir) for c in caches}, lengths=LENGTHS)
    for step in (0, 1, 29, 30, 333, 10**6):
        for d in range(4):
            batch = reader.read(source.fetch(step, 1, HostSlice(d, 4))[0])
            expected = stream.host_batch(step, d)
            assert batch.positions == expected.positions and not batch.skipped
            for name in LENGTHS:
                assert batch.features[name].dtype == np.int32
                assert np.array_equal(batch.features[name], expected.features[name]), (step, d, name)


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


def test_byte_ranges_that_disagree_with_the_offsets_sidecar_are_refused(root):
    source, reader = source_and_reader(root)
    step = source.fetch(0, 1, HostSlice(0, 4))[0]
    task = step.tasks[1]
    moved = dataclasses.replace(task.reads[0], byte_offset=task.reads[0].byte_offset + 1)
    bad = dataclasses.replace(
        step, tasks=(step.tasks[0], dataclasses.replace(task, reads=(moved, *task.reads[1:])))
    )
    with pytest.raises(
        AssignmentError, match=r"verified offsets give \d+\+\d+\. The instructions were made for other"
    ):
        reader.read(bad)


def test_a_uri_that_is_not_the_named_shard_is_refused(root):
    source, reader = source_and_reader(root)
    step = source.fetch(0, 1, HostSlice(0, 4))[0]
    task = step.tasks[1]
    wrong = dataclasses.replace(task.reads[0], shard=task.reads[0].shard + 1)
    bad = dataclasses.replace(
        step, tasks=(step.tasks[0], dataclasses.replace(task, reads=(wrong, *task.reads[1:])))
    )
    with pytest.raises(
        AssignmentError, match="as shard 1 of task 'toy_random', but that version folder holds"
    ):
        reader.read(bad)


def test_a_cache_with_other_bytes_than_the_plan_pins_is_refused(tmp_path, root):
    from tests.test_cache_job import build

    source, reader = source_and_reader(root)
    step = source.fetch(0, 1, HostSlice(0, 4))[0]
    task = step.tasks[0]
    # The same task rebuilt with another seed: the same folder layout, other bytes.
    reseeded = build(str(tmp_path), task="toy_det", num_shards=3, seed=1).version_dir
    moved = dataclasses.replace(task.reads[0], uri=reseeded + "/" + task.reads[0].uri.rsplit("/", 1)[1])
    bad = dataclasses.replace(
        step, tasks=(dataclasses.replace(task, reads=(moved, *task.reads[1:])), step.tasks[1])
    )
    with pytest.raises(CacheFormatError, match="but the run plan names version"):
        reader.read(bad)


def test_a_flipped_byte_is_an_error_naming_shard_record_and_offset(tmp_path, root):
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    source, reader = source_and_reader(str(copy))
    step = source.fetch(0, 1, HostSlice(0, 1))[0]
    read = step.tasks[0].reads[0]
    with open(read.uri, "r+b") as f:
        f.seek(read.byte_offset + read.byte_length - 6)  # inside the last record's payload
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(CorruptRecordError, match=r"train\.tfrecord-00000-of-00003.*record \d+.*offset \d+"):
        reader.read(step)
