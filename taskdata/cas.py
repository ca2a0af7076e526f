"""Compare-and-swap of one shared file, on local disk or ``gs://``: every read-modify-write of shared state.

Shared state is a small file that several processes change: a run record (``taskdata.runs.store``), a task's
``CURRENT`` pointer and the lease of a cache version being built (``taskdata.beam.job``,
``taskdata.cache.lease``). Each change is read, compute, ``swap``: the swap writes only if the file is still
what was read, so a change computed from a state that another writer has replaced since is never stored;
``update`` loops until a computed change is stored or refused. An acknowledged change is therefore always
stored, whatever other writers do at the same moment.

Example usage::

    version, written = cas.update(path, lambda data: None if data == b"x" else b"x")

- Local disk: the swap compares and writes under an exclusive ``flock`` of ``{path}.lock`` (created once,
  never removed: its existence means nothing). The kernel releases a ``flock`` when its holder dies, SIGKILL
  included, so no stale lock is ever left behind and the next writer waits only for the holder's exit.
  The bytes go to a temporary file beside ``path`` that is synced and then renamed over it (and the folder
  synced): readers see the old file or the new one, whole, and an acknowledged write survives a power cut.
  A writer killed before its rename leaves its temporary file; the next writer of ``path`` removes it under
  the lock (whose holder is the only live writer of ``path``).
  ``flock`` must work on the file system (local disks do; some network file systems do not).
- ``gs://``: the object's generation is the version; the write is an upload with ``ifGenerationMatch`` (0:
  the object must not exist), which GCS refuses with 412 if another writer got there first. gcsfs sends
  only ``ifGenerationMatch=0`` (its ``mode="create"``), so these requests go through google-cloud-storage
  (installed with gcsfs), whose client honours ``STORAGE_EMULATOR_HOST`` as gcsfs does. Nothing is held, so
  a writer that dies leaves nothing for the next one to wait for; an upload that dies is never published.

Other ``scheme://`` file systems have no compare-and-swap here and are refused with an error saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from taskdata import fs

if TYPE_CHECKING:
    from google.cloud.storage import Client

__all__ = ["MAX_ATTEMPTS", "ContentionError", "UnsupportedStoreError", "Version", "read", "swap", "update"]

# Writers that keep losing give up after this many tries (with growing random pauses, about 25 s in all).
MAX_ATTEMPTS = 200
_PAUSE_S = 0.002
_MAX_PAUSE_S = 0.2


class ContentionError(RuntimeError):
    """A change not stored: other writers changed the file first ``MAX_ATTEMPTS`` times in a row (a service
    condition, not a bad request: the CLI exits 3, the server answers 503)."""


class UnsupportedStoreError(ValueError):
    """A shared file on a file system without compare-and-swap here (neither local disk nor gs://)."""


@dataclasses.dataclass(frozen=True)
class Version:
    """A shared file as read: its bytes (None: no such file) and, on gs://, its generation (0: no object).

    A swap against this version writes only while the file is still exactly this: the same bytes on local
    disk (compared under the lock), the same generation on gs:// (which changes with every write).
    """

    path: str
    data: bytes | None
    generation: int | None = None

    def __post_init__(self) -> None:
        if self.data is not None and not isinstance(self.data, bytes):
            raise TypeError(f"A version's data must be bytes or None but got {type(self.data).__name__}.")
        if fs.is_remote(self.path):
            if not isinstance(self.generation, int) or self.generation < 0 or (self.generation == 0) != (self.data is None):
                raise ValueError(f"A version of {self.path} needs its generation (0 exactly when the object does "
                                 f"not exist) but got {self.generation!r}.")
        elif self.generation is not None:
            raise ValueError(f"A local file has no generation, but the version of {self.path} has {self.generation!r}.")


def read(path: str) -> Version:
    """The file at ``path`` as it is now, whole (None if it does not exist)."""
    if fs.is_remote(path):
        blob = _blob(path)
        from google.api_core.exceptions import NotFound

        try:
            data = blob.download_as_bytes()
            if blob.generation is None:
                # GCS names the generation of the bytes in the download's own response (x-goog-generation);
                # an emulator that does not (gcp-storage-emulator) honours no precondition either, so the
                # generation asked for after the download is as good as any there.
                blob.reload()
        except NotFound:
            return Version(path, None, 0)
        return Version(path, data, int(blob.generation))
    try:
        with open(_local(path), "rb") as f:
            return Version(path, f.read())
    except FileNotFoundError:
        return Version(path, None)


def swap(version: Version, data: bytes) -> Version | None:
    """Writes ``data`` at ``version.path`` if the file is still ``version``: the new version, or None (nothing
    written) if another writer changed the file since ``version`` was read."""
    if not isinstance(data, bytes):
        raise TypeError(f"swap writes bytes but got {type(data).__name__}.")
    if fs.is_remote(version.path):
        from google.api_core.exceptions import PreconditionFailed

        blob = _blob(version.path)
        try:
            blob.upload_from_string(data, content_type="application/octet-stream",
                                    if_generation_match=version.generation)
        except PreconditionFailed:
            return None
        return Version(version.path, data, int(blob.generation))
    path = _local(version.path)
    with _locked(path):
        _remove_temporaries(path)
        try:
            with open(path, "rb") as f:
                now: bytes | None = f.read()
        except FileNotFoundError:
            now = None
        if now != version.data:
            return None
        _replace(path, data)
    return Version(version.path, data)


def update(path: str, change: Callable[[bytes | None], bytes | None]) -> tuple[Version, bool]:
    """Applies ``change`` to the file at ``path`` until the result is stored: (the file as it is then, True if
    this call wrote it).

    ``change`` gets the file's bytes (None if there is none) and returns the bytes to store, or None to leave
    the file as it is; it may raise to refuse. When another writer changes the file between the read and the
    swap, the file is read again and ``change`` is called on the new bytes, so it must decide from what it is
    given alone. After ``MAX_ATTEMPTS`` lost swaps, ContentionError (nothing stored).
    """
    pause = _PAUSE_S
    for _ in range(MAX_ATTEMPTS):
        version = read(path)
        data = change(version.data)
        if data is None or data == version.data:
            return version, False
        written = swap(version, data)
        if written is not None:
            return written, True
        time.sleep(random.uniform(0, pause))
        pause = min(pause * 2, _MAX_PAUSE_S)
    raise ContentionError(f"Gave up changing {path}: other writers changed it first {MAX_ATTEMPTS} times in a row, "
                          "and this change was not stored. Retry when fewer writers are at work.")


def _local(path: str) -> str:
    return os.path.abspath(path.removeprefix("file://"))


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Holds an exclusive flock of ``{path}.lock``: released when the block ends or the process dies."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _temporary(path: str) -> str:
    return f"{path}.tmp-{uuid.uuid4().hex}"


def _remove_temporaries(path: str) -> None:
    """Removes the temporary files of ``path`` left by writers killed before their rename. Called under the lock:
    its holder is the only live writer of ``path``, and has not made its own yet."""
    folder, name = os.path.split(path)
    dead = re.compile(re.escape(name) + r"\.tmp-[0-9a-f]{32}")  # _temporary's names
    for entry in os.listdir(folder):
        if dead.fullmatch(entry):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, entry))


def _replace(path: str, data: bytes) -> None:
    folder = os.path.dirname(path)
    tmp = _temporary(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    directory = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(directory)  # the rename itself, durable
    finally:
        os.close(directory)


def _blob(path: str) -> Any:
    scheme, _, rest = path.partition("://")
    if scheme not in ("gs", "gcs"):
        raise UnsupportedStoreError(
            f"{path}: shared state (run records, CURRENT, leases) is changed by compare-and-swap, which taskdata "
            f"does on local disk and on gs:// only, not on {scheme}://. Keep the cache root on one of those."
        )
    bucket, _, key = rest.partition("/")
    if not bucket or not key:
        raise ValueError(f"{path} names no object: expected gs://BUCKET/PATH.")
    return _client(os.getpid()).bucket(bucket).blob(key)


@functools.cache
def _client(pid: int) -> Client:
    # One per process (a forked child must not share its parent's connections), with the credentials gcsfs
    # finds by default (Application Default Credentials), or the emulator of STORAGE_EMULATOR_HOST.
    from google.cloud.storage import Client

    return Client()
