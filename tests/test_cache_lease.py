"""Abandoned incomplete versions are removed (a stale lease decides), live and complete ones never."""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

import fsspec
import pytest

from taskdata import fs
from taskdata.cache.lease import VersionLease, last_write, lease_path, remove_abandoned_versions
from tests.cache_helpers import Killed, build


def _age(folder: Path, seconds: float) -> None:
    stamp = time.time() - seconds
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (stamp, stamp))


def _killed_before_its_manifest(root: Path, monkeypatch, **kwargs) -> Path:
    write_atomic = fs.write_atomic

    def dying(path, data):
        if path.endswith("/manifest.json"):
            raise Killed(path)
        write_atomic(path, data)

    monkeypatch.setattr(fs, "write_atomic", dying)
    with pytest.raises(Killed):
        build(root, force=True, **kwargs)
    monkeypatch.setattr(fs, "write_atomic", write_atomic)
    [incomplete] = [p for p in (root / "toy_det").glob("v*") if not (p / "COMPLETED").exists()]
    return incomplete


@pytest.mark.slow
def test_the_next_job_removes_abandoned_versions_says_so_and_keeps_live_and_complete_ones(tmp_path, monkeypatch):
    root = tmp_path / "caches"
    complete = Path(build(root, num_shards=2).version_dir)
    killed = _killed_before_its_manifest(root, monkeypatch, num_shards=2)
    assert (killed / "_tmp" / "LEASE").exists() and list(killed.glob("train.tfrecord-*"))
    _age(killed, 3600)
    older = root / "toy_det" / "v20200101T000000Z-0ldc0de0"  # an older taskdata's leftover: no lease at all
    (older / "_tmp" / "spill").mkdir(parents=True)
    (older / "_tmp" / "spill" / "part0.spill").write_bytes(b"x" * 100)
    _age(older, 7200)
    live = root / "toy_det" / "v20990101T000000Z-11fe11fe"  # a job writing right now, on another machine
    VersionLease(str(live), refresh_s=60).__enter__().__exit__()
    _age(complete, 3600)

    logs: list[str] = []
    again = build(root, num_shards=2, logs=logs)
    assert again.reused and again.version_dir == str(complete)
    assert sorted(p.name for p in (root / "toy_det").glob("v*")) == sorted([complete.name, live.name])
    removed = [line for line in logs if line.startswith("[cache] removed abandoned incomplete version")]
    assert len(removed) == 2  # oldest name first
    assert re.match(rf"\[cache\] removed abandoned incomplete version {older}: no COMPLETED marker and nothing "
                    r"written for 72\d\d s \(stale after 900 s; no lease", removed[0]), removed[0]
    assert re.match(rf"\[cache\] removed abandoned incomplete version {killed}: no COMPLETED marker and nothing "
                    rf"written for 36\d\d s \(stale after 900 s; lease of pid {os.getpid()} on ", removed[1]), removed[1]


def test_a_running_jobs_lease_is_rewritten_until_it_ends(tmp_path):
    version = tmp_path / "v1"
    with VersionLease(str(version), refresh_s=0.05):
        first = os.stat(lease_path(str(version))).st_mtime_ns
        deadline = time.monotonic() + 10
        while os.stat(lease_path(str(version))).st_mtime_ns == first and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.stat(lease_path(str(version))).st_mtime_ns > first
    ended = os.stat(lease_path(str(version))).st_mtime_ns
    time.sleep(0.2)
    assert os.stat(lease_path(str(version))).st_mtime_ns == ended
    assert remove_abandoned_versions(str(tmp_path), 900, print) == []


@pytest.mark.slow
def test_a_job_writing_a_version_for_longer_than_stale_after_keeps_it(tmp_path, monkeypatch):
    # The lease is rewritten every stale_after/10: a slow build is never taken for a dead one.
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    root = tmp_path / "caches"
    seen: list[list[str]] = []
    from taskdata.beam import job

    finalize = job._finalize

    def slow_finalize(*args, **kwargs):
        time.sleep(1.0)  # longer than stale_after below, while the lease is held
        seen.append(remove_abandoned_versions(str(root / "toy_det"), 0.5, print))
        return finalize(*args, **kwargs)

    monkeypatch.setattr(job, "_finalize", slow_finalize)
    result = build(root, num_shards=2, stale_after_s=0.5)
    assert seen == [[]] and (Path(result.version_dir) / "COMPLETED").exists()
    assert not (Path(result.version_dir) / "_tmp").exists()


def test_on_an_object_store_too(monkeypatch):
    root = f"memory://leases-{uuid.uuid4().hex}/caches/toy_det"
    memory = fsspec.filesystem("memory")
    with VersionLease(f"{root}/v20240101T000000Z-aaaaaaaa", refresh_s=60):
        pass
    memory.pipe(f"{root.removeprefix('memory://')}/v20240101T000000Z-bbbbbbbb/COMPLETED", b"{}")
    written = last_write(f"{root}/v20240101T000000Z-aaaaaaaa")
    assert written is not None and abs(written - time.time()) < 60
    assert remove_abandoned_versions(root, 900, print) == []
    logs: list[str] = []
    removed = remove_abandoned_versions(root, 900, logs.append, now=time.time() + 3600)
    assert removed == [f"{root}/v20240101T000000Z-aaaaaaaa"] and len(logs) == 1
    assert fs.listdir(root) == ["v20240101T000000Z-bbbbbbbb"]
