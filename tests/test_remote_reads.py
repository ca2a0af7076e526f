"""Reading caches from an object store: the trainer client's batches from ``gs://`` (gcsfs, against the
concurrent test store ``bench/object_store.py``) are the local batches byte for byte, with several steps'
reads in flight, within the bounds asked for, each sidecar fetched once and no object metadata asked;
failed and stalled requests are retried without reordering anything; a truncated remote shard is an
error naming the record; and the fetcher's own retries (fsspec's HTTP filesystem, which has none of its own).

gcsfs runs in child processes: it reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT on import (without it, it asks
Google's metadata server about the bucket), and the test process may have imported it already."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from bench.object_store import running_store
from taskdata.cache.format import find_version
from taskdata.index import BlockOrder, RunPlan
from taskdata.runs import RunStore
from tests.client_helpers import LENGTHS, REPO, shared_root
from trainer_client.assignments import HostSlice
from trainer_client.digest import batch_hash, row_digests
from trainer_client.iterator import DataIterator
from trainer_client.local_source import LocalAssignments

pytestmark = pytest.mark.slow

BUCKET = "reads"

# The client's path: DataIterator over LocalAssignments, the caches at gs:// through gcsfs.
SCRIPT = """
import json, sys
from taskdata.cache.ranges import FetchOptions
from taskdata.index import RunPlan
from trainer_client.assignments import HostSlice
from trainer_client.digest import batch_hash, row_digests
from trainer_client.iterator import DataIterator
from trainer_client.local_source import LocalAssignments
a = json.loads(sys.argv[1])
source = LocalAssignments(RunPlan.from_dict(a["plan"]), a["version_dirs"])
hashes = {}
with DataIterator(source, a["lengths"], start=a["start"], host_slice=HostSlice(*a["host"]), stop_step=a["stop"],
                  workers=a["workers"], read_ahead_bytes=a["read_ahead_bytes"], fetch=FetchOptions(**a["fetch"])) as it:
    for batch in it:
        hashes[batch.step] = batch_hash(row_digests(batch.features))
print(json.dumps(hashes))
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return shared_root(tmp_path_factory)


def gcs_env(url: str) -> dict[str, str]:
    return dict(os.environ, STORAGE_EMULATOR_HOST=url, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
                PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def version_dirs(root: str, plan: RunPlan) -> dict[str, str]:
    """Each task's pinned version folder, as a path relative to ``root`` (the bucket's object names)."""
    out = {}
    for task in plan.task_names:
        found = find_version(f"{root}/{task}", plan.caches[task].fingerprint)
        assert found is not None
        out[task] = os.path.relpath(found, root)
    return out


def remote_hashes(url: str, root: str, plan: RunPlan, *, start: int = 0, stop: int, host=(0, 1), workers: int = 0,
                  read_ahead_bytes: int = 64 << 20, **fetch) -> dict[int, str]:
    args = {"plan": plan.to_dict(), "lengths": LENGTHS, "start": start, "stop": stop, "host": list(host),
            "workers": workers, "read_ahead_bytes": read_ahead_bytes, "fetch": fetch,
            "version_dirs": {t: f"gs://{BUCKET}/{d}" for t, d in version_dirs(root, plan).items()}}
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(args)], env=gcs_env(url), cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return {int(step): digest for step, digest in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def local_hashes(root: str, plan: RunPlan, *, start: int = 0, stop: int, host=(0, 1)) -> dict[int, str]:
    dirs = {task: os.path.join(root, d) for task, d in version_dirs(root, plan).items()}
    with DataIterator(LocalAssignments(plan, dirs), LENGTHS, start=start, host_slice=HostSlice(*host),
                      stop_step=stop) as it:  # fmt: skip
        return {batch.step: batch_hash(row_digests(batch.features)) for batch in it}


def plans(root: str) -> dict[str, RunPlan]:
    plan = RunStore(root).get("mix4").plan
    return {"feistel": plan, "block": dataclasses.replace(plan, name="mix4_blocks", epoch_order=BlockOrder(4))}


def instruction_reads(root: str, plan: RunPlan, start: int, stop: int, host=(0, 1)) -> tuple[int, int]:
    """(The most ranged reads the instructions of one step in [start, stop) name, and their sum)."""
    dirs = {task: os.path.join(root, d) for task, d in version_dirs(root, plan).items()}
    source = LocalAssignments(plan, dirs)
    try:
        counts = [sum(len(t) for t in s.tasks) for s in source.fetch(start, stop - start, HostSlice(*host))]
    finally:
        source.close()
    return max(counts), sum(counts)


def test_batches_from_the_object_store_are_the_local_ones_with_steps_in_flight_and_sidecars_read_once(root):
    # 70 steps of 16: epochs 0 to 3 of toy_random (~345 records, 12 examples a step) and 0 to 1 of toy_det.
    with running_store(root, BUCKET, delay_ms=20) as store:
        for name, plan, workers, fetch in (("feistel", plans(root)["feistel"], 0, {}),
                                           ("block", plans(root)["block"], 0, {}),
                                           ("feistel", plans(root)["feistel"], 2, {}),
                                           ("feistel, no requests shared", plans(root)["feistel"], 0,
                                            {"max_gap": 0, "cache_bytes": 0})):
            before = store.counts(reset_max=True)
            got = remote_hashes(store.url, root, plan, stop=70, workers=workers, **fetch)
            served = store.counts() - before
            assert got == local_hashes(root, plan, stop=70), (name, workers)
            # Each offsets sidecar read once per process (a whole-object GET; with workers, by each process that
            # reads its shard), and no metadata asked of any shard or sidecar: opening a shard costs one round
            # trip, its sidecar's.
            sidecars = {k: n for k, n in served.objects.items() if ".offsets " in k}
            assert sidecars and all(k.endswith(" media") and 1 <= n <= workers + 1 for k, n in sidecars.items()), (
                name, workers, sidecars)
            assert not [k for k in served.objects if k.endswith(" metadata") and ".tfrecord-" in k]
            most, total = instruction_reads(root, plan, 0, 70)
            if fetch:
                # Every request its own step's: more in flight at once than any one step makes, so later
                # steps' reads were in flight with it.
                assert served.max_ranged_in_flight > most, (name, served)
            else:
                # Requests extended over later steps' reads: fewer GETs than the instructions name.
                assert served.requests["media ranged"] < total / 2, (name, workers, served, total)


def test_requests_in_flight_and_the_read_ahead_stay_within_their_bounds(root):
    plan = plans(root)["feistel"]
    expected = local_hashes(root, plan, start=30, stop=50)
    per_step = instruction_reads(root, plan, 30, 50)[0]
    # At most 3 requests in flight; then a read-ahead of 1 byte, requests not shared: one step's reads at a time
    # (the records' reads; sidecars are whole-object GETs, one per shard, made as instructions are computed).
    for options, read_ahead, most in (({"max_in_flight": 3}, 64 << 20, 3),
                                      ({"max_gap": 0, "cache_bytes": 0}, 1, per_step)):
        with running_store(root, BUCKET, delay_ms=10) as store:
            got = remote_hashes(store.url, root, plan, start=30, stop=50, read_ahead_bytes=read_ahead, **options)
            served = store.counts()
        assert got == expected
        assert 0 < served.max_ranged_in_flight <= most, (options, served)


def test_failed_and_stalled_requests_are_retried_and_nothing_moves(root):
    plan = plans(root)["feistel"]
    # gcsfs retries a 503 itself (after a pause of 1-2 s); a stalled request is the fetcher's to cancel and retry.
    with running_store(root, BUCKET, delay_ms=5, fail_every=5, stall_every=7, stall_s=5) as store:
        got = remote_hashes(store.url, root, plan, start=20, stop=45, timeout=1.0, first_backoff=0.01)
        served = store.counts()
    assert got == local_hashes(root, plan, start=20, stop=45)
    assert served.failed >= 2 and served.stalled >= 2, served


TRUNCATED = """
import sys
from taskdata.cache.reader import CacheReader
from taskdata.cache.tfrecord import CorruptRecordError
try:
    CacheReader(sys.argv[1]).read_records("train", [1, 1, 1], [0, 1, int(sys.argv[2])])
except CorruptRecordError as e:
    print(e.record_index, e.byte_offset, e.reason)
"""


@pytest.mark.parametrize("cut", ["inside", "before"])
def test_a_truncated_remote_shard_is_an_error_naming_its_record(root, tmp_path, cut):
    plan = plans(root)["feistel"]
    relative = version_dirs(root, plan)["toy_det"]
    copy = tmp_path / "bucket"
    shutil.copytree(os.path.join(root, relative), copy / relative)
    from taskdata.cache.reader import CacheReader

    with CacheReader(str(copy / relative)) as reader:
        offsets = reader.shard_offsets("train", 1)
        path = reader.shard_path("train", 1)
    last = len(offsets) - 2
    # Cut inside the last record (a short ranged read) or before it (a range past the end: 416).
    size = int(offsets[last]) + 3 if cut == "inside" else int(offsets[last - 1]) + 1
    with open(path, "r+b") as f:
        f.truncate(size)
    with running_store(str(copy), BUCKET) as store:
        out = subprocess.run([sys.executable, "-c", TRUNCATED, f"gs://{BUCKET}/{relative}", str(last)],
                             env=gcs_env(store.url), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    index, offset, reason = out.stdout.strip().split(" ", 2)
    # Records 0 and 1 verified; the last one is named with its offset in the file.
    assert (int(index), int(offset)) == (last, int(offsets[last])) and "truncated shard" in reason, out.stdout
    assert f"the file ends at byte {size}" in reason


def test_the_fetcher_retries_what_a_filesystem_does_not(tmp_path):
    # fsspec's HTTP filesystem does not retry: every other read of object bytes fails (503), one in three stalls.
    from taskdata.cache.ranges import FetchOptions, RangeFetcher, RangeReadError

    data = os.urandom(50_000)
    (tmp_path / "blob.bin").write_bytes(data)
    begins, sizes = [0, 1_000, 20_000, 49_990], [100, 5_000, 64, 10]
    with running_store(str(tmp_path), BUCKET, fail_every=2, stall_every=3, stall_s=3) as store:
        url = f"{store.url}/download/storage/v1/b/{BUCKET}/o/blob.bin?alt=media"
        fetcher = RangeFetcher(FetchOptions(max_gap=0, timeout=1.0, attempts=6, first_backoff=0.01))
        buffer, end = fetcher.start(url, begins, sizes).result()
        assert (buffer, end) == (b"".join(data[b : b + n] for b, n in zip(begins, sizes, strict=True)), None)
        served = store.counts()
        assert served.failed >= 2 and served.stalled >= 1, served
        hopeless = RangeFetcher(FetchOptions(attempts=1))
        with pytest.raises(RangeReadError, match=r"bytes 0\.\.99 of .*blob.bin.* failed 1 times"):
            for _ in range(3):  # one of them meets the injected 503
                hopeless.start(url, [0], [100]).result()
        fetcher.close()
        hopeless.close()


# s3:// through s3fs (fsspec's async API, as gcsfs), against moto's S3 server in the same child process.
S3_SCRIPT = """
import json, os, sys
from moto.server import ThreadedMotoServer
a = json.loads(sys.argv[1])
server = ThreadedMotoServer(ip_address="127.0.0.1", port=a["port"], verbose=False)
server.start()
try:
    import s3fs
    s3fs.S3FileSystem(anon=False).mkdir("reads")
    s3fs.S3FileSystem(anon=False).put(a["local"], "reads/", recursive=True)
    from taskdata.cache.ranges import FetchOptions
    from taskdata.index import RunPlan
    from trainer_client.assignments import HostSlice
    from trainer_client.digest import batch_hash, row_digests
    from trainer_client.iterator import DataIterator
    from trainer_client.local_source import LocalAssignments
    plan = RunPlan.from_dict(a["plan"])
    source = LocalAssignments(plan, {t: "s3://reads/" + d for t, d in a["version_dirs"].items()})
    with DataIterator(source, a["lengths"], host_slice=HostSlice(0, 1), stop_step=a["stop"]) as it:
        print(json.dumps({b.step: batch_hash(row_digests(b.features)) for b in it}))
finally:
    server.stop()
"""


def test_batches_from_s3_are_the_local_ones(root, tmp_path):
    if os.environ.get("CI") == "true":
        import moto  # noqa: F401  CI installs them (the test extra): absent there is a failure
        import s3fs  # noqa: F401
    else:
        pytest.importorskip("s3fs")
        pytest.importorskip("moto.server")
    from tests.client_helpers import free_port

    plan = plans(root)["block"]
    dirs = version_dirs(root, plan)
    bucket = tmp_path / "bucket"
    for relative in dirs.values():  # only the pinned versions, under the bucket's names
        shutil.copytree(os.path.join(root, relative), bucket / relative)
    port = free_port()
    env = dict(os.environ, FSSPEC_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="test",
               AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = {"port": port, "local": str(bucket) + "/", "plan": plan.to_dict(), "lengths": LENGTHS,
            "stop": 40, "version_dirs": dirs}
    out = subprocess.run([sys.executable, "-c", S3_SCRIPT, json.dumps(args)], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = {int(step): digest for step, digest in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    assert got == local_hashes(root, plan, stop=40)
