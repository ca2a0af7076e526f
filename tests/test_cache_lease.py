"""Abandoned incomplete versions are removed (a stale lease decides), live and complete ones never."""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

import pytest

from deploy.fault_drills import shared_state
from taskdata import fs
from taskdata.cache.lease import (
    LeaseLostError,
    VersionLease,
    last_write,
    lease_path,
    remove_abandoned_versions,
)
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


def test_a_job_whose_lease_was_taken_for_removal_commits_nothing(tmp_path):
    version = tmp_path / "toy_det" / "v20240101T000000Z_aaaaaaaa"
    with VersionLease(str(version), refresh_s=60) as lease:
        logs: list[str] = []
        removed = remove_abandoned_versions(str(tmp_path / "toy_det"), 900, logs.append, now=time.time() + 3600)
        assert removed == [str(version)] and not version.exists()
        with pytest.raises(LeaseLostError, match=r"Another job took the lease of .* Nothing was committed"):
            lease.confirm()


def test_a_lease_rewritten_while_the_remover_decides_keeps_its_version(tmp_path, monkeypatch):
    from taskdata.cache import lease as lease_module

    version = tmp_path / "toy_det" / "v20240101T000000Z_aaaaaaaa"
    with VersionLease(str(version), refresh_s=60) as lease:
        last_write_of = lease_module.last_write

        def beat_meanwhile(version_dir):
            lease.confirm()  # the holder beats after the remover read the lease, before its swap
            return last_write_of(version_dir)

        monkeypatch.setattr(lease_module, "last_write", beat_meanwhile)
        assert remove_abandoned_versions(str(tmp_path / "toy_det"), 900, print, now=time.time() + 3600) == []
        assert version.exists()
        lease.confirm()  # still its own


def test_a_beat_stored_though_its_answer_was_lost_keeps_the_lease(tmp_path, monkeypatch):
    from taskdata import cas

    version = tmp_path / "toy_det" / "v20240101T000000Z_aaaaaaaa"
    with VersionLease(str(version), refresh_s=60) as lease:
        swap = cas.swap

        def stored_then_failed(old, data):
            monkeypatch.setattr(cas, "swap", swap)
            swap(old, data)
            raise OSError("connection reset after the upload")

        monkeypatch.setattr(cas, "swap", stored_then_failed)
        with pytest.raises(OSError, match="connection reset"):
            lease.confirm()
        lease.confirm()  # the next beat finds its own write there and goes on
        assert b'"beat": 3' in Path(lease_path(str(version))).read_bytes()


def _leases_on_gcs(root: str) -> dict[str, object]:
    with VersionLease(f"{root}/v20240101T000000Z-aaaaaaaa", refresh_s=60):
        pass
    fs.write_atomic(f"{root}/v20240101T000000Z-bbbbbbbb/COMPLETED", b"{}")
    written = last_write(f"{root}/v20240101T000000Z-aaaaaaaa")
    kept = remove_abandoned_versions(root, 900, print)
    logs: list[str] = []
    removed = remove_abandoned_versions(root, 900, logs.append, now=time.time() + 3600)
    return {"written_ago": None if written is None else time.time() - written, "kept": kept, "removed": removed,
            "logs": logs, "left": fs.listdir(root)}


@pytest.mark.slow
def test_on_an_object_store_too():
    root = f"gs://{shared_state.BUCKET}/leases-{uuid.uuid4().hex}/caches/toy_det"
    with shared_state.fake_gcs_server() as env:
        found = shared_state.run_with_environment(env, _leases_on_gcs, root)
    assert found["written_ago"] is not None and abs(found["written_ago"]) < 60
    assert found["kept"] == [] and found["removed"] == [f"{root}/v20240101T000000Z-aaaaaaaa"]
    assert len(found["logs"]) == 1 and found["left"] == ["v20240101T000000Z-bbbbbbbb"]
