"""Leases on the cache versions being written, and the removal of incomplete versions no live job writes.

A build writes its version folder for minutes or hours before ``COMPLETED`` makes it a cache, and a
build that dies leaves that folder incomplete for good (a crash-looping job leaves one per attempt).
The job therefore holds a lease while it writes: ``{version}/_tmp/LEASE`` (which host and process hold
it, and a count of its beats), rewritten every ``refresh_s``. Any later job removes an incomplete version
(no ``COMPLETED``) in which nothing, the lease included, has been written for ``stale_after_s``: a live
job's lease is never that old. A complete version is never removed.

Holder and remover meet by compare-and-swap on the lease (``taskdata.cas``): the holder rewrites it only
if it is still the lease it last wrote, and checks so once more (``VersionLease.confirm``) right before it
writes its manifest; the remover first replaces the lease it read with a tombstone, and only if that swap
succeeds (the holder wrote nothing in between) removes the folder. So a job whose version is being removed
never commits it (``LeaseLostError``), and a version whose job confirmed is never removed, unless that
job stalls for ``stale_after_s`` between its confirmation and ``COMPLETED``.

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

from taskdata import cas, fs
from taskdata.cache.format import completed_path, list_versions

__all__ = [
    "DEFAULT_STALE_AFTER_S",
    "LEASE",
    "LeaseLostError",
    "VersionLease",
    "last_write",
    "remove_abandoned_versions",
]

LEASE = "LEASE"
DEFAULT_STALE_AFTER_S = 900.0


def lease_path(version_dir: str) -> str:
    return fs.join(version_dir, "_tmp", LEASE)


class LeaseLostError(RuntimeError):
    """The lease of a version being written was taken by a job that removes it as abandoned."""


class VersionLease:
    """Holds the lease of one version folder from ``__enter__`` to ``__exit__``, rewriting it in a thread."""

    def __init__(self, version_dir: str, refresh_s: float):
        if not refresh_s > 0:
            raise ValueError(f"A lease's refresh interval must be positive but got {refresh_s!r} s.")
        self._version_dir = version_dir
        self._path = lease_path(version_dir)
        self._refresh_s = refresh_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="cache-version-lease", daemon=True)
        self._holder = {"host": socket.gethostname(), "pid": os.getpid(),
                        "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        self._lock = threading.Lock()
        self._beats = 0
        self._held: cas.Version | None = None  # the lease as this holder last wrote it; None once lost

    def __enter__(self) -> VersionLease:
        with self._lock:
            self._beat(cas.Version(self._path, None, 0 if fs.is_remote(self._path) else None))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def confirm(self) -> None:
        """Rewrites the lease now; LeaseLostError if another job took it (it is removing the version)."""
        with self._lock:
            if self._held is not None:
                self._beat(self._held)
            if self._held is None:
                raise LeaseLostError(
                    f"Another job took the lease of {self._version_dir} and is removing it as abandoned: this job "
                    "wrote nothing there for longer than that job's --stale-after. Nothing was committed; rerun "
                    "(with a larger --stale-after if this job can stall that long)."
                )

    def _beat(self, last: cas.Version) -> None:
        self._beats += 1
        data = (json.dumps({**self._holder, "beat": self._beats}, sort_keys=True) + "\n").encode()
        written = cas.swap(last, data)
        if written is None:
            # A beat of ours that was stored though its answer was lost (an error after the upload) changed
            # the lease too: one holding this holder's identity is still this holder's.
            now = cas.read(self._path)
            if now.data is not None and _holder_of(now.data) == self._holder:
                written = cas.swap(now, data)
        self._held = written

    def _keep(self) -> None:
        while not self._stop.wait(self._refresh_s):
            with self._lock:
                if self._held is None:
                    return  # lost: confirm() tells the job
                # A failed refresh (a local OSError, or an object store's error of its client's own types) is
                # retried at the next one: only a long silence makes the lease stale; confirm() raises any error.
                with contextlib.suppress(Exception):
                    self._beat(self._held)


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
        lease = cas.read(lease_path(version_dir))  # before the times: a later beat makes the swap below fail
        newest = last_write(version_dir)
        if newest is None:
            log(f"[cache] cannot tell when {version_dir} was last written (the file system gives no times): kept")
            continue
        idle = now - newest
        if idle < stale_after_s or fs.exists(completed_path(version_dir)):
            continue
        holder = _holder(lease)
        if not _is_tombstone(lease) and cas.swap(lease, _tombstone()) is None:
            continue  # its job wrote the lease since it was read: alive
        if fs.exists(completed_path(version_dir)):
            continue
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


def _holder_of(data: bytes) -> dict[str, Any] | None:
    with contextlib.suppress(ValueError, TypeError, KeyError):
        lease = json.loads(data)
        return {key: lease[key] for key in ("host", "pid", "since")}
    return None


def _tombstone() -> bytes:
    remover = {"host": socket.gethostname(), "pid": os.getpid(),
               "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    return (json.dumps({"removed_by": remover}, sort_keys=True) + "\n").encode()


def _is_tombstone(lease: cas.Version) -> bool:
    with contextlib.suppress(ValueError, TypeError):
        return lease.data is not None and "removed_by" in json.loads(lease.data)
    return False


def _holder(lease: cas.Version) -> str:
    if lease.data is None:
        return "no lease: written by a job without one, or one that died before taking it"
    try:
        holder = json.loads(lease.data)
        if "removed_by" in holder:
            remover = holder["removed_by"]
            return f"taken for removal by pid {remover['pid']} on {remover['host']} at {remover['at']}"
        return f"lease of pid {holder['pid']} on {holder['host']} since {holder['since']}"
    except (ValueError, KeyError, TypeError):
        return "an unreadable lease"
