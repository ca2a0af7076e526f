"""taskdata.cas: a swap writes only over what was read, on local disk (flock) and on gs:// (generations)."""

from __future__ import annotations

import os
import threading

import pytest

from deploy.fault_drills import shared_state
from taskdata import cas


def test_a_swap_writes_only_over_the_version_it_was_given(tmp_path):
    path = str(tmp_path / "state" / "x.json")
    absent = cas.read(path)
    assert absent == cas.Version(path, None)
    first = cas.swap(absent, b"one")
    assert first == cas.Version(path, b"one") and cas.read(path) == first
    assert cas.swap(absent, b"two") is None  # the file exists now: a create from 'absent' loses
    assert cas.swap(first, b"two") == cas.Version(path, b"two")
    assert cas.swap(first, b"three") is None  # stale: the file is b"two"
    assert (tmp_path / "state" / "x.json").read_bytes() == b"two"
    assert sorted(os.listdir(tmp_path / "state")) == ["x.json", "x.json.lock"]  # no temporary file left


def test_the_next_writer_removes_temporary_files_left_by_dead_writers_of_its_file_only(tmp_path):
    path = str(tmp_path / "x.json")
    version = cas.swap(cas.read(path), b"one")
    dead = [tmp_path / f"x.json.tmp-{i:032x}" for i in range(2)]  # as writers killed before their rename leave
    others = ["y.json.tmp-" + "0" * 32, "x.json.tmp-mine", "x.json2.tmp-" + "0" * 32]  # not x.json's
    for leftover in [*dead, *(tmp_path / name for name in others)]:
        leftover.write_bytes(b"half a rec")
    assert cas.swap(version, b"two") is not None
    assert sorted(os.listdir(tmp_path)) == sorted(["x.json", "x.json.lock", *others])
    assert cas.read(path).data == b"two"


def test_update_calls_the_change_again_on_what_another_writer_stored(tmp_path, monkeypatch):
    path = str(tmp_path / "counter")
    cas.swap(cas.read(path), b"1")
    swap, seen = cas.swap, []

    def raced(version, data):
        if len(seen) == 1:  # another writer stores 5 between the first read and its swap
            swap(cas.read(path), b"5")
        return swap(version, data)

    monkeypatch.setattr(cas, "swap", raced)

    def change(data):
        seen.append(data)
        return str(int(data) + 1).encode()

    assert cas.update(path, change) == (cas.Version(path, b"6"), True)
    assert seen == [b"1", b"5"]
    assert cas.update(path, lambda data: None) == (cas.Version(path, b"6"), False)  # None: leave it
    with pytest.raises(ValueError, match="refused"):
        cas.update(path, lambda data: (_ for _ in ()).throw(ValueError("refused")))


def test_a_writer_that_keeps_losing_gives_up_saying_nothing_was_stored(tmp_path, monkeypatch):
    path = str(tmp_path / "x.json")
    cas.swap(cas.read(path), b"one")
    lost = []
    monkeypatch.setattr(cas, "MAX_ATTEMPTS", 3)
    monkeypatch.setattr(cas, "swap", lambda version, data: lost.append(data))  # another writer was first, each time
    with pytest.raises(cas.ContentionError, match=rf"Gave up changing {path}: other writers changed it first 3 "
                                                  r"times in a row, and this change was not stored\. Retry"):
        cas.update(path, lambda data: b"two")
    assert lost == [b"two"] * 3 and cas.read(path).data == b"one"


def test_threads_incrementing_one_counter_lose_no_increment(tmp_path):
    path = str(tmp_path / "counter")
    told: list[int] = []

    def work() -> None:
        for _ in range(15):
            version, _ = cas.update(path, lambda data: str(int(data or b"0") + 1).encode())
            told.append(int(version.data))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert int(cas.read(path).data) == 60 and sorted(told) == list(range(1, 61))


def test_other_file_systems_are_refused_with_the_reason():
    with pytest.raises(cas.UnsupportedStoreError, match=r"on local disk and on gs:// only, not on memory://"):
        cas.read("memory://bucket/_runs/r.json")
    with pytest.raises(ValueError, match="needs its generation"):
        cas.Version("gs://b/x", b"data", 0)


@pytest.mark.slow
def test_gcs_generation_preconditions_are_honoured_by_fake_gcs_server_and_ignored_by_gcp_storage_emulator():
    figures = shared_state.gcp_storage_emulator_honours_preconditions()
    # GCS answers the second create with 412: swap returns None.
    assert figures["fake_gcs_server"] == {"first": True, "second": False}
    # gcp-storage-emulator stores both: compare-and-swap cannot be tested on it (hence fake-gcs-server).
    assert figures["gcp_storage_emulator"] == {"first": True, "second": True}


@pytest.mark.slow
def test_a_writer_killed_holding_the_lock_or_mid_swap_on_gcs_holds_nobody_up():
    figures = shared_state.sigkill_holder(rounds=2, gcs_kills=3)
    assert figures["ok"], figures
    # Each killed holder had written its temporary file; the next writer removed it.
    assert figures["holders_temporary_file_seen"] == 2 and figures["temporary_files_after_the_next_write"] == 0
    assert figures["killed_change_visible"] == 0
    assert figures["seconds_from_kill_to_next_acknowledged"]["max"] < 10
