"""Content digests of source files, for fingerprints: an edited file changes its task's fingerprint.

The digest is the file's CRC32C, as GCS writes it in every object's metadata (``crc32c``: base64 of
the big-endian value; composite objects have no md5, every object has this), so on GCS it comes with
the listing at no cost, and a copy of the same files on local disk (or any store) gets the same
digest: a cache built from either is the same cache. Files without one in their metadata are read
and checksummed once (CRC32C runs at several GB/s): the digest is remembered by (path, size, modification time, inode) in this
process and, where an entry point says where (``remember_digests_in``: the command line uses
``{home}/source-digests``, and the cache job hands the folder to its workers), on disk, so that the next process need not read a large
corpus again. A remembered digest is trusted only for a file last modified well before it was hashed:
file times are coarse, and an edit within the same tick as the hashing would otherwise keep the old
digest (git's "racily clean" entries). The memo only saves work: a digest never depends on it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import threading
import time
from typing import Any

import google_crc32c

from taskdata import fs

__all__ = ["digests_remembered_in", "file_digest", "remember_digests_in"]

# Modification times closer than this to the moment of hashing are not trusted (coarse clocks, NFS).
RACY_NS = 2_000_000_000

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
    """``"crc32c:<base64>"`` of the file's bytes: from an object store's metadata where it is, else computed."""
    filesystem, inner = fs.filesystem(path)
    if fs.is_remote(path):
        info = filesystem.info(inner)
        if info.get("crc32c"):
            return f"crc32c:{info['crc32c']}"
        version = info.get("generation") or info.get("mtime") or info.get("updated") or info.get("LastModified")
        if version is None:  # nothing says whether the object changed: read it every time
            return _crc32c(path)
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
    digest = _crc32c(path)
    with _lock:
        _memory[key] = (digest, hashed_at_ns)
    if _memo_dir is not None and key[0] == "local" and trusted(hashed_at_ns):
        _write_memo(key, digest, hashed_at_ns)
    return digest


def _crc32c(path: str) -> str:
    checksum = google_crc32c.Checksum()
    with fs.open_file(path, "rb") as f:
        while chunk := f.read(8 << 20):
            checksum.update(chunk)
    return "crc32c:" + base64.b64encode(checksum.digest()).decode()


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
