"""Source files are fingerprinted by content: an edit that keeps the size changes the task's fingerprint."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
import uuid

import fsspec
import google_crc32c
import pytest

from taskdata.sources import TextLineSource, digest
from taskdata.sources.digest import file_digest, remember_digests_in
from tests.gcs_emulator import gcs_emulator


@pytest.fixture(autouse=True)
def _fresh_memo(monkeypatch):
    monkeypatch.setattr(digest, "_memory", {})
    monkeypatch.setattr(digest, "_memo_dir", None)


def _count_hashing(monkeypatch) -> list[str]:
    hashed: list[str] = []
    crc32c = digest._crc32c
    monkeypatch.setattr(digest, "_crc32c", lambda path: hashed.append(path) or crc32c(path))
    return hashed


def _age(path, seconds: float = 3600) -> None:
    stamp = time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(stamp, stamp))


def _crc32c(data: bytes) -> str:
    return "crc32c:" + base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def test_a_local_file_is_identified_by_its_crc32c_written_as_gcs_writes_it(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"hello world\n")
    # The emulator's (and GCS's) metadata for an object holding b"hello world\n": crc32c "8P9ykg==".
    assert file_digest(str(path)) == _crc32c(b"hello world\n") == "crc32c:8P9ykg=="


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


def test_an_object_stores_crc32c_is_used_without_reading_the_object(monkeypatch):
    memory = fsspec.filesystem("memory")
    path = f"memory://digests-{uuid.uuid4().hex}/c4-train.00000-of-00001.json"
    with fsspec.open(path, "wb") as f:
        f.write(b"{}\n")
    hashed = _count_hashing(monkeypatch)
    assert file_digest(path) == _crc32c(b"{}\n") and len(hashed) == 1  # no checksum in its metadata: read
    info = type(memory).info
    monkeypatch.setattr(type(memory), "info", lambda self, p, **kw: {**info(self, p, **kw), "crc32c": "AAAAAA==",
                                                                        "md5Hash": "q83vEg=="})
    assert file_digest(path) == "crc32c:AAAAAA==" and len(hashed) == 1


def test_a_same_size_edit_changes_a_text_source_fingerprint(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("the word found\n")
    _age(path)
    source = TextLineSource({"train": str(tmp_path / "*.txt")})
    before = source.fingerprint_description()
    path.write_text("the word FOUND\n")
    assert source.fingerprint_description() != before


@pytest.mark.slow
def test_a_file_on_gcs_and_its_local_copy_have_the_same_digest(tmp_path):
    # A cache built from gs:// and one built from a local copy of the same files must be the same cache.
    with gcs_emulator("digests") as env:
        local = tmp_path / "c4-train.00000-of-00001.json.gz"
        local.write_bytes(os.urandom(100_000))
        code = (
            "import sys\n"
            "from gcsfs import GCSFileSystem\n"
            "from taskdata.sources.digest import file_digest\n"
            f"GCSFileSystem().put_file({str(local)!r}, 'digests/c4/x.json.gz')\n"
            "print(file_digest('gs://digests/c4/x.json.gz'))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == file_digest(str(local)) == _crc32c(local.read_bytes())
