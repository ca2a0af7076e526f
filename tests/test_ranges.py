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
    begins = np.array([0, 10, 30, 100, 150])
    ends = begins + np.array([10, 10, 5, 20, 1])
    # Gaps: 0 (adjacent), 10, 65, 30.
    starts, stops, group = coalesce(begins, ends, max_gap=0)
    assert (starts.tolist(), stops.tolist(), group.tolist()) == ([0, 30, 100, 150], [20, 35, 120, 151], [0, 0, 1, 2, 3])
    starts, stops, group = coalesce(begins, ends, max_gap=30)
    assert (starts.tolist(), stops.tolist(), group.tolist()) == ([0, 100], [35, 151], [0, 0, 0, 1, 1])
    assert coalesce(begins, ends, max_gap=1000)[:2] == ([0], [151])
    # Any order, overlaps too: a range inside another joins it.
    starts, stops, group = coalesce(np.array([100, 0, 5, 40]), np.array([120, 30, 10, 41]), max_gap=5)
    assert (starts.tolist(), stops.tolist(), group.tolist()) == ([0, 40, 100], [30, 41, 120], [2, 0, 0, 1])
    assert [len(a) for a in coalesce(np.array([], np.int64), np.array([], np.int64), 10)] == [0, 0, 0]


def test_a_request_takes_in_the_later_ranges_that_chain_onto_it_and_later_calls_find_them() -> None:
    data = np.random.default_rng(1).bytes(100_000)
    path = memory_file(data)
    fetcher = RangeFetcher(FetchOptions(max_gap=100, max_request_bytes=10_000))
    fetcher.announce("later", path, [1_050, 1_200, 50_000, 9_000, 30_000], [100, 100, 10, 100, 10])
    # [1000, 1040) chains onto 1050 and 1200 (gaps of 10 and 50); 9000 and 50000 are too far, 30000 too.
    first = fetcher.start(path, [1_000], [40])
    assert first.result() == (data[1_000:1_040], None) and fetcher.requests == 1
    fetcher.withdraw("later")
    # The later calls find their bytes: no new request.
    assert fetcher.start(path, [1_050, 1_200], [100, 100]).result() == (data[1_050:1_150] + data[1_200:1_300], None)
    assert fetcher.requests == 1
    assert fetcher.start(path, [9_000], [100]).result() == (data[9_000:9_100], None) and fetcher.requests == 2
    # Extension stops at max_request_bytes from the request's start (the ranges asked are never cut).
    fetcher.announce("chain", path, np.arange(20_000, 40_000, 150), np.full(134, 100))
    fetcher.start(path, [19_950], [40]).result()
    fetcher.withdraw("chain")
    assert fetcher.requests == 3
    fetcher.start(path, [29_750], [100]).result()  # the last later range within 10,000 bytes of its start
    assert fetcher.requests == 3
    fetcher.start(path, [35_000], [100]).result()  # beyond them: asked again
    assert fetcher.requests == 4
    fetcher.close()


def test_kept_requests_stay_within_cache_bytes() -> None:
    data = bytes(range(256)) * 100
    path = memory_file(data)
    fetcher = RangeFetcher(FetchOptions(max_gap=0, cache_bytes=250))
    for begin in (0, 1_000, 2_000):  # 100 bytes each: the third drops the first
        assert fetcher.start(path, [begin], [100]).result() == (data[begin : begin + 100], None)
    assert fetcher.requests == 3
    fetcher.start(path, [2_010], [10]).result()
    fetcher.start(path, [1_010], [10]).result()
    assert fetcher.requests == 3
    fetcher.start(path, [10], [10]).result()
    assert fetcher.requests == 4
    fetcher.close()


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


def test_ranges_of_many_files_come_in_the_order_asked_and_no_request_spans_two_files() -> None:
    rng = np.random.default_rng(2)
    datas = [rng.bytes(3000) for _ in range(3)]
    paths = [memory_file(data) for data in datas]
    fetcher = RangeFetcher(FetchOptions(max_gap=1 << 20))  # within one file, everything is one request
    files, begins, sizes = [2, 0, 2, 1, 0, 1], [10, 2990, 500, 0, 0, 2999], [5, 10, 100, 3000, 1, 1]
    buffer, file_end = fetcher.start(paths, begins, sizes, files).result()
    assert file_end is None
    assert buffer == b"".join(datas[f][b : b + n] for f, b, n in zip(files, begins, sizes, strict=True))
    assert fetcher.requests == 3  # one per file
    fetcher.close()
    # Announced ranges of several files extend each file's request, and later calls find them.
    fetcher = RangeFetcher(FetchOptions(max_gap=100))
    fetcher.announce(7, paths, [2000, 2500, 2800], [10, 10, 10], [0, 2, 1])
    fetcher.start(paths[0], [1990], [5]).result()
    fetcher.start(paths[2], [2400], [5]).result()
    assert fetcher.requests == 2
    fetcher.withdraw(7)
    assert fetcher.start(paths, [2000, 2500], [10, 10], [0, 2]).result() == (datas[0][2000:2010] + datas[2][2500:2510], None)
    assert fetcher.requests == 2
    fetcher.start(paths[1], [2790], [5]).result()  # withdrawn: not taken in
    assert fetcher.start(paths[1], [2800], [10]).result() == (datas[1][2800:2810], None)
    assert fetcher.requests == 4
    with pytest.raises(ValueError, match="file_index must give each of the 2 ranges a file in \\[0, 3\\)"):
        fetcher.start(paths, [0, 0], [1, 1], [0, 3])
    with pytest.raises(ValueError, match="Ranges of 3 files need file_index"):
        fetcher.start(paths, [0], [1])
    fetcher.close()


def test_a_range_past_the_request_that_starts_last_before_it_is_found_in_one_that_holds_it() -> None:
    data = np.random.default_rng(3).bytes(10_000)
    path = memory_file(data)
    fetcher = RangeFetcher(FetchOptions(max_gap=0))
    fetcher.start(path, [1500], [100]).result()  # [1500, 1600)
    fetcher.start(path, [1000], [4000]).result()  # [1000, 5000): overlaps it
    assert fetcher.requests == 2
    # [3000, 3100) lies past [1500, 1600), the request that starts last before it, and inside [1000, 5000).
    assert fetcher.start(path, [3000, 1550], [100, 10]).result() == (data[3000:3100] + data[1550:1560], None)
    assert fetcher.requests == 2
    fetcher.close()


def test_a_file_of_several_shorter_than_its_ranges_gives_the_ranges_before_its_cut_and_its_size() -> None:
    short, whole = bytes(range(256)) * 4, bytes(range(256)) * 8  # 1024 and 2048 bytes
    paths = [memory_file(short), memory_file(whole)]
    fetcher = RangeFetcher()
    assert fetcher.start(paths, [0, 1000, 0], [10, 50, 10], [1, 0, 1]).result() == (whole[:10] + short[1000:], 1024)
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
    fetcher.close()
    flaky.failures = 4
    fresh = RangeFetcher(FetchOptions(attempts=4, first_backoff=0.001))
    with pytest.raises(RangeReadError, match=r"bytes 0\.\.9 of /flaky/f.bin failed 4 times \(last: ConnectionResetError"):
        fresh.start("flakymemory:///flaky/f.bin", [0], [10]).result()
    fresh.close()


def test_a_request_that_failed_is_asked_again_by_the_next_call(flaky) -> None:
    data = bytes(range(100))
    fsspec.filesystem("memory").pipe_file("/flaky/g.bin", data)
    flaky.failures = 1
    fetcher = RangeFetcher(FetchOptions(attempts=1))
    with pytest.raises(RangeReadError):
        fetcher.start("flakymemory:///flaky/g.bin", [0], [10]).result()
    assert fetcher.start("flakymemory:///flaky/g.bin", [0], [10]).result() == (data[:10], None)
    assert fetcher.requests == 2
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
