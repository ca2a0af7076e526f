"""Content digests of source files, for fingerprints: an edited file changes its task's fingerprint.

Object stores keep a checksum of every object in its metadata (GCS: ``md5Hash``, or ``crc32c`` for a
composite object; S3 and others: an ETag), which comes with the listing at no cost. Other files are
hashed (sha256) once: the digest is remembered by (path, size, modification time, inode) in this
process and, where an entry point says where (``remember_digests_in``: the command line uses
``{home}/source-digests``, and the cache job hands the folder to its workers), on disk, so that the next process need not read a large
corpus again. A remembered digest is trusted only for a file last modified well before it was hashed:
file times are coarse, and an edit within the same tick as the hashing would otherwise keep the old
digest (git's "racily clean" entries). The memo only saves work: a digest never depends on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from typing import Any

from taskdata import fs

__all__ = ["digests_remembered_in", "file_digest", "remember_digests_in"]

# Modification times closer than this to the moment of hashing are not trusted (coarse clocks, NFS).
RACY_NS = 2_000_000_000
_CHECKSUM_FIELDS = (("md5Hash", "md5"), ("crc32c", "crc32c"), ("ETag", "etag"), ("etag", "etag"))

_lock = threading.Lock()
_memory: dict[tuple[Any, ...], tuple[str, int]] = {}  # memo key -> (digest, time hashing started, ns)
_memo_dir: str | None = None


def remember_digests_in(folder: str | None) -> None:
    """Also remember local files' digests on disk under ``folder`` (None: in this process only)."""
    global _memo_dir
    _memo_dir = folder


def digests_remembered_in() -> str | None:
    """The folder given to ``remember_digests_in`` (the cache job hands it to its workers)."""
    return _memo_dir


def file_digest(path: str) -> str:
    """``"md5:..."``, ``"crc32c:..."`` or ``"etag:..."`` from an object store's metadata, else ``"sha256:..."``."""
    filesystem, inner = fs.filesystem(path)
    if fs.is_remote(path):
        info = filesystem.info(inner)
        for field, label in _CHECKSUM_FIELDS:
            if info.get(field):
                return f"{label}:{info[field]}"
        version = info.get("generation") or info.get("mtime") or info.get("updated") or info.get("LastModified")
        if version is None:  # nothing says whether the object changed: read it every time
            return _sha256(path)
        return _memoized(("remote", path, info.get("size"), str(version)), path, None)
    stat = os.stat(inner)
    key = ("local", os.path.realpath(inner), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    return _memoized(key, path, stat.st_mtime_ns)


def _memoized(key: tuple[Any, ...], path: str, mtime_ns: int | None) -> str:
    def trusted(hashed_at_ns: int) -> bool:
        return mtime_ns is None or mtime_ns + RACY_NS <= hashed_at_ns

    with _lock:
        found = _memory.get(key)
    if found is None and _memo_dir is not None and key[0] == "local":
        found = _read_memo(key)
    if found is not None and trusted(found[1]):
        return found[0]
    hashed_at_ns = time.time_ns()
    digest = _sha256(path)
    with _lock:
        _memory[key] = (digest, hashed_at_ns)
    if _memo_dir is not None and key[0] == "local" and trusted(hashed_at_ns):
        _write_memo(key, digest, hashed_at_ns)
    return digest


def _sha256(path: str) -> str:
    with fs.open_file(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def _memo_path(key: tuple[Any, ...]) -> str:
    assert _memo_dir is not None
    name = hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()[:40]
    return os.path.join(_memo_dir, f"{name}.json")


def _read_memo(key: tuple[Any, ...]) -> tuple[str, int] | None:
    try:
        with open(_memo_path(key), "rb") as f:
            entry = json.loads(f.read())
        if entry["key"] == list(key):
            return str(entry["digest"]), int(entry["hashed_at_ns"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: hash the file again
    return None


def _write_memo(key: tuple[Any, ...], digest: str, hashed_at_ns: int) -> None:
    entry = {"key": list(key), "digest": digest, "hashed_at_ns": hashed_at_ns}
    with contextlib.suppress(OSError):  # a read-only home only costs hashing again next time
        fs.write_atomic(_memo_path(key), json.dumps(entry).encode())
