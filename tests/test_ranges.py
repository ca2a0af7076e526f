"""``RangeFetcher``: coalescing, the result's layout, retries that keep every range in its place, truncated
files, and a cache read through it (fsspec's in-memory filesystem: the thread-pool path of filesystems
without an async API). The async path against a real store is in ``tests/test_remote_reads.py``."""

from __future__ import annotations

import uuid

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from taskdata.cache.ranges import FetchOptions, RangeFetcher, RangeReadError, coalesce
from taskdata.cache.reader import CacheReader
from taskdata.cache.tfrecord import CorruptRecordError


def memory_file(data: bytes) -> str:
    path = f"/ranges-{uuid.uuid4().hex}/file.bin"
    fsspec.filesystem("memory").pipe_file(path, data)
    return f"memory://{path}"


def test_close_ranges_are_one_request_and_far_ones_are_not() -> None:
    begins, sizes = np.array([0, 10, 30, 100, 150]), np.array([10, 10, 5, 20, 1])
    # Gaps: 0 (adjacent), 10, 65, 30.
    starts, ends, first = coalesce(begins, sizes, max_gap=0)
    assert (starts.tolist(), ends.tolist(), first.tolist()) == ([0, 30, 100, 150], [20, 35, 120, 151], [0, 2, 3, 4])
    starts, ends, first = coalesce(begins, sizes, max_gap=30)
    assert (starts.tolist(), ends.tolist(), first.tolist()) == ([0, 100], [35, 151], [0, 3])
    starts, ends, first = coalesce(begins, sizes, max_gap=1000)
    assert (starts.tolist(), ends.tolist(), first.tolist()) == ([0], [151], [0])
    assert [len(a) for a in coalesce(np.array([], np.int64), np.array([], np.int64), 10)] == [0, 0, 0]
    with pytest.raises(ValueError, match="increasing order"):
        coalesce(np.array([10, 5]), np.array([1, 1]), 0)


@pytest.mark.parametrize("max_gap", [0, 7, 1 << 20])
def test_the_result_is_the_ranges_one_after_another_however_they_were_requested(max_gap) -> None:
    data = np.random.default_rng(0).bytes(5000)
    path = memory_file(data)
    begins, sizes = [0, 100, 107, 900, 4990], [100, 5, 200, 1, 10]
    fetcher = RangeFetcher(FetchOptions(max_gap=max_gap))
    buffer, file_end = fetcher.start(path, begins, sizes).result()
    assert file_end is None
    assert buffer == b"".join(data[b : b + n] for b, n in zip(begins, sizes, strict=True))
    fetcher.close()


def test_a_file_shorter_than_the_ranges_gives_what_it_holds_and_its_size() -> None:
    data = bytes(range(256)) * 4  # 1024 bytes
    path = memory_file(data)
    fetcher = RangeFetcher()
    assert fetcher.start(path, [10, 1000], [10, 50]).result() == (data[10:20] + data[1000:], 1024)
    assert fetcher.start(path, [10, 2000], [10, 50]).result() == (data[10:20], 1024)
    fetcher.close()


class _Flaky(MemoryFileSystem):
    """The in-memory filesystem, whose reads fail the first ``failures`` times (a store that errs)."""

    protocol = "flakymemory"
    failures = 0
    calls: list[tuple[int, int]] = []

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol("memory://" + path.removeprefix("flakymemory://"))

    def cat_file(self, path, start=None, end=None, **kwargs):
        type(self).calls.append((start, end))
        if type(self).failures > 0:
            type(self).failures -= 1
            raise ConnectionResetError("injected")
        return super().cat_file(path, start=start, end=end, **kwargs)


@pytest.fixture
def flaky():
    fsspec.register_implementation("flakymemory", _Flaky, clobber=True)
    _Flaky.calls = []
    yield _Flaky
    _Flaky.failures = 0


def test_a_failed_request_is_retried_and_its_bytes_land_where_they_were_asked(flaky) -> None:
    data = bytes(range(200))
    fsspec.filesystem("memory").pipe_file("/flaky/f.bin", data)
    flaky.failures = 3
    fetcher = RangeFetcher(FetchOptions(max_gap=0, attempts=4, first_backoff=0.001, max_in_flight=1))
    buffer, _ = fetcher.start("flakymemory:///flaky/f.bin", [0, 50, 120], [10, 10, 10]).result()
    assert buffer == data[0:10] + data[50:60] + data[120:130]
    assert len(flaky.calls) == 3 + 3  # three failures, each retried, then the three requests
    flaky.failures = 4
    with pytest.raises(RangeReadError, match=r"bytes 0\.\.9 of /flaky/f.bin failed 4 times \(last: ConnectionResetError"):
        fetcher.start("flakymemory:///flaky/f.bin", [0], [10]).result()
    fetcher.close()


def test_a_missing_file_fails_at_once() -> None:
    fetcher = RangeFetcher(FetchOptions(attempts=5))
    with pytest.raises(FileNotFoundError):
        fetcher.start(f"memory:///nothing-{uuid.uuid4().hex}", [0], [1]).result()
    fetcher.close()


def test_options_check_themselves() -> None:
    with pytest.raises(ValueError, match="max_in_flight must be an integer >= 1 but got 0"):
        FetchOptions(max_in_flight=0)
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds but got -1"):
        FetchOptions(timeout=-1)
    with pytest.raises(ValueError, match="max_gap must be an integer >= 0"):
        FetchOptions(max_gap=True)
    assert [FetchOptions(first_backoff=0.1).backoff(k) for k in (1, 2, 3, 10)] == [0.1, 0.2, 0.4, 5.0]
    with pytest.raises(ValueError, match="local"):
        RangeFetcher().start("/tmp/x", [0], [1])


def _memory_copy(version_dir: str) -> str:
    """The version folder copied into fsspec's in-memory filesystem; its memory:// URL."""
    import os

    memory = fsspec.filesystem("memory")
    target = f"/cache-{uuid.uuid4().hex}/{os.path.basename(version_dir)}"
    for folder, _, files in os.walk(version_dir):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                memory.pipe_file(target + "/" + os.path.relpath(path, version_dir), f.read())
    return f"memory://{target}"


@pytest.fixture(scope="module")
def toy_version(tmp_path_factory) -> str:
    from tests.client_helpers import shared_root

    root = shared_root(tmp_path_factory)
    from taskdata.cache.format import find_version
    from taskdata.runs import RunStore

    plan = RunStore(root).get("mix4").plan
    found = find_version(f"{root}/toy_det", plan.caches["toy_det"].fingerprint)
    assert found is not None
    return found


@pytest.mark.slow
def test_a_cache_on_a_filesystem_without_async_reads_reads_the_same_records(toy_version) -> None:
    # slow: builds the shared toy caches when this module runs alone.
    remote = _memory_copy(toy_version)
    shards, records = [0, 0, 1, 2, 0, 2], [5, 3, 2, 9, 4, 0]
    with CacheReader(toy_version) as local, CacheReader(remote) as far:
        assert far.read_records("train", shards, records) == local.read_records("train", shards, records)
        pending = [far.start_spans("train", [s], [r]) for s, r in zip(shards, records, strict=True)]
        assert [p.result() for p in pending] == [local.read_spans("train", [s], [r]) for s, r in
                                                 zip(shards, records, strict=True)]  # fmt: skip
    memory = fsspec.filesystem("memory")
    shard = f"{remote.removeprefix('memory://')}/train.tfrecord-00001-of-00003"
    with CacheReader(toy_version) as local:
        offsets = local.shard_offsets("train", 1)
    memory.pipe_file(shard, memory.cat_file(shard)[: int(offsets[3]) + 5])  # cut inside record 3
    with CacheReader(remote) as far, pytest.raises(CorruptRecordError) as error:
        far.read_records("train", [1, 1, 1], [1, 2, 3])
    assert (error.value.record_index, error.value.byte_offset) == (3, int(offsets[3]))
    assert "truncated shard" in str(error.value)
