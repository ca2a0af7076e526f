"""Leases on the cache versions being written, and the removal of incomplete versions no live job writes.

A build writes its version folder for minutes or hours before ``COMPLETED`` makes it a cache, and a
build that dies leaves that folder incomplete for good (a crash-looping job leaves one per attempt).
The job therefore holds a lease while it writes: ``{version}/_tmp/LEASE`` (which host and process hold
it), rewritten every ``refresh_s``. Any later job removes an incomplete version (no ``COMPLETED``) in
which nothing, the lease included, has been written for ``stale_after_s``: a live job's lease is never
that old. A complete version is never removed.

Works on any fsspec file system (local disk, ``gs://``): modification times are the file system's,
compared with this machine's clock, so ``stale_after_s`` must exceed any clock skew by far (the
default: 15 minutes, against a lease rewritten every 30 seconds).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from taskdata import fs
from taskdata.cache.format import completed_path, list_versions

__all__ = ["DEFAULT_STALE_AFTER_S", "LEASE", "VersionLease", "last_write", "remove_abandoned_versions"]

LEASE = "LEASE"
DEFAULT_STALE_AFTER_S = 900.0


def lease_path(version_dir: str) -> str:
    return fs.join(version_dir, "_tmp", LEASE)


class VersionLease:
    """Holds the lease of one version folder from ``__enter__`` to ``__exit__``, rewriting it in a thread."""

    def __init__(self, version_dir: str, refresh_s: float):
        if not refresh_s > 0:
            raise ValueError(f"A lease's refresh interval must be positive but got {refresh_s!r} s.")
        self._path = lease_path(version_dir)
        self._refresh_s = refresh_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="cache-version-lease", daemon=True)
        self._holder = {"host": socket.gethostname(), "pid": os.getpid(),
                        "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}

    def __enter__(self) -> VersionLease:
        self._write()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _write(self) -> None:
        fs.write_atomic(self._path, (json.dumps(self._holder, sort_keys=True) + "\n").encode())

    def _keep(self) -> None:
        while not self._stop.wait(self._refresh_s):
            # A failed refresh is retried at the next one: only a long silence makes the lease stale.
            with contextlib.suppress(OSError):
                self._write()


def last_write(version_dir: str) -> float | None:
    """The newest modification time (seconds since the epoch) of anything under ``version_dir``; None
    when the file system tells no time (such a version is never taken for abandoned)."""
    filesystem, inner = fs.filesystem(version_dir)
    try:
        infos = list(filesystem.find(inner, withdirs=True, detail=True).values())
        if not fs.is_remote(version_dir):
            infos.append(filesystem.info(inner))  # an empty local folder still has its own time
    except FileNotFoundError:
        return -math.inf  # gone, or an object store's empty prefix: nothing was ever written
    times = [t for t in (_seconds(info) for info in infos) if t is not None]
    return max(times) if times else (-math.inf if not infos else None)


def _seconds(info: dict[str, Any]) -> float | None:
    # 'created' last: file systems that keep no modification time (fsspec's memory://) rewrite objects whole.
    for key in ("mtime", "updated", "LastModified", "last_modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, str):
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        return float(value)
    return None


def remove_abandoned_versions(task_root: str, stale_after_s: float, log: Callable[[str], None],
                              now: float | None = None) -> list[str]:
    """Removes the incomplete versions under ``task_root`` untouched for ``stale_after_s``; returns them."""
    removed = []
    now = time.time() if now is None else now
    for name in list_versions(task_root):
        version_dir = fs.join(task_root, name)
        if fs.exists(completed_path(version_dir)):
            continue
        newest = last_write(version_dir)
        if newest is None:
            log(f"[cache] cannot tell when {version_dir} was last written (the file system gives no times): kept")
            continue
        idle = now - newest
        if idle < stale_after_s or fs.exists(completed_path(version_dir)):
            continue
        holder = _holder(version_dir)
        filesystem, inner = fs.filesystem(version_dir)
        try:
            filesystem.rm(inner, recursive=True)
        except FileNotFoundError:
            continue  # another job removed it first
        removed.append(version_dir)
        log(f"[cache] removed abandoned incomplete version {version_dir}: no COMPLETED marker and nothing "
            f"written for {'ever' if newest == -math.inf else f'{idle:.0f} s'} (stale after {stale_after_s:g} s; "
            f"{holder})")
    return removed


def _holder(version_dir: str) -> str:
    try:
        holder = json.loads(fs.read_bytes(lease_path(version_dir)))
        return f"lease of pid {holder['pid']} on {holder['host']} since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "no lease: written by a job without one, or one that died before taking it"
