"""Source files are fingerprinted by content: an edit that keeps the size changes the task's fingerprint."""

from __future__ import annotations

import hashlib
import os
import time
import uuid

import fsspec
import pytest

from taskdata.sources import TextLineSource, digest
from taskdata.sources.digest import file_digest, remember_digests_in


@pytest.fixture(autouse=True)
def _fresh_memo(monkeypatch):
    monkeypatch.setattr(digest, "_memory", {})
    monkeypatch.setattr(digest, "_memo_dir", None)


def _count_hashing(monkeypatch) -> list[str]:
    hashed: list[str] = []
    sha256 = digest._sha256
    monkeypatch.setattr(digest, "_sha256", lambda path: hashed.append(path) or sha256(path))
    return hashed


def _age(path, seconds: float = 3600) -> None:
    stamp = time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(stamp, stamp))


def test_a_local_file_is_identified_by_the_sha256_of_its_content(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"the word found\n")
    assert file_digest(str(path)) == "sha256:" + hashlib.sha256(b"the word found\n").hexdigest()


def test_an_edit_that_keeps_size_and_modification_time_is_seen_while_the_time_is_recent(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("the word found\n")
    before = file_digest(str(path))
    stamp = path.stat().st_mtime_ns
    path.write_text("the word FOUND\n")
    os.utime(path, ns=(stamp, stamp))  # the same tick of a coarse clock
    assert file_digest(str(path)) != before


def test_an_old_file_is_hashed_once_per_process_and_once_per_memo_folder(tmp_path, monkeypatch):
    path = tmp_path / "a.txt"
    path.write_text("some text\n")
    _age(path)
    hashed = _count_hashing(monkeypatch)
    remember_digests_in(str(tmp_path / "memo"))
    first = file_digest(str(path))
    assert file_digest(str(path)) == first and hashed == [str(path)]
    monkeypatch.setattr(digest, "_memory", {})  # another process with the same memo folder
    assert file_digest(str(path)) == first and hashed == [str(path)]
    path.write_text("other text\n")  # an edit changes the modification time: hashed again
    assert file_digest(str(path)) != first and len(hashed) == 2


def test_object_store_checksums_are_used_without_reading_the_object(monkeypatch):
    memory = fsspec.filesystem("memory")
    path = f"memory://digests-{uuid.uuid4().hex}/c4-train.00000-of-00001.json"
    with fsspec.open(path, "wb") as f:
        f.write(b"{}\n")
    hashed = _count_hashing(monkeypatch)
    assert file_digest(path) == "sha256:" + hashlib.sha256(b"{}\n").hexdigest() and len(hashed) == 1
    info = type(memory).info

    def with_metadata(**fields):
        return lambda self, p, **kw: {**info(self, p, **kw), **fields}

    monkeypatch.setattr(type(memory), "info", with_metadata(crc32c="AAAAAA=="))  # a composite GCS object
    assert file_digest(path) == "crc32c:AAAAAA=="
    monkeypatch.setattr(type(memory), "info", with_metadata(crc32c="AAAAAA==", md5Hash="q83vEg=="))
    assert file_digest(path) == "md5:q83vEg=="
    assert len(hashed) == 1


def test_a_same_size_edit_changes_a_text_source_fingerprint(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("the word found\n")
    _age(path)
    source = TextLineSource({"train": str(tmp_path / "*.txt")})
    before = source.fingerprint_description()
    path.write_text("the word FOUND\n")
    assert source.fingerprint_description() != before
