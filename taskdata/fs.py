"""Small file-system helpers over fsspec, so that every path may be local or ``gs://``.

gcsfs honours ``STORAGE_EMULATOR_HOST`` (a local emulator in tests). Writes that must look atomic go
through ``write_atomic``: write to a temporary name beside the target, then move it into place.
"""

from __future__ import annotations

import os
import uuid
from typing import IO, Any

__all__ = [
    "exists",
    "filesystem",
    "glob",
    "is_remote",
    "join",
    "listdir",
    "makedirs",
    "open_file",
    "read_bytes",
    "read_many",
    "size",
    "sizes_in",
    "temporary_path",
    "write_atomic",
]


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def filesystem(path: str) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for ``path``."""
    import fsspec

    if not is_remote(path):
        return fsspec.filesystem("file"), os.path.abspath(path.removeprefix("file://"))
    fs, inner = fsspec.core.url_to_fs(path)
    return fs, inner


def _url(fs: Any, inner: str) -> str:
    protocol = fs.protocol[0] if isinstance(fs.protocol, tuple | list) else fs.protocol
    return inner if protocol in ("file", "local") else f"{protocol}://{inner}"


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def open_file(path: str, mode: str = "rb", *, random_access: bool = False) -> IO[Any]:
    """Opens ``path``. Remote files read for streaming use read-ahead (without it, each small read of
    a line reader is one HTTP request); ``random_access`` fetches exactly the ranges asked for."""
    fs, inner = filesystem(path)
    if is_remote(path) and "r" in mode:
        return fs.open(inner, mode, cache_type="none" if random_access else "readahead")
    return fs.open(inner, mode)


def read_bytes(path: str) -> bytes:
    """The whole file; a remote one in one request (opening it as a file would ask for its metadata first)."""
    if not is_remote(path):
        with open(os.path.abspath(path.removeprefix("file://")), "rb") as f:
            return f.read()
    fs, inner = filesystem(path)
    return bytes(fs.cat_file(inner))


def read_many(paths: list[str]) -> list[bytes | None]:
    """The bytes of every file of ``paths``, in order, None for a file that does not exist. Remote files
    are fetched concurrently (gcsfs batches them on one event loop): a sidecar per shard of a
    65,536-shard cache is one request each, and one after another they would take minutes."""
    if not paths:
        return []
    if not is_remote(paths[0]):
        out: list[bytes | None] = []
        for path in paths:
            try:
                with open(os.path.abspath(path.removeprefix("file://")), "rb") as f:
                    out.append(f.read())
            except FileNotFoundError:
                out.append(None)
        return out
    fs, _ = filesystem(paths[0])
    inners = [filesystem(path)[1] for path in paths]
    found = fs.cat(inners, on_error="return")
    out = []
    for inner in inners:
        data = found.get(inner)
        if isinstance(data, BaseException) and not isinstance(data, FileNotFoundError):
            raise data
        out.append(None if data is None or isinstance(data, BaseException) else data)
    return out


def sizes_in(folder: str, suffix: str = "") -> dict[str, int]:
    """{base name: byte size} of the files directly in ``folder`` whose names end with ``suffix`` (empty if
    it does not exist), from one listing: on an object store, a paginated list of the prefix instead of one
    request per file. Locally only those files are sized (a stat each; a sidecar folder holds 131,072)."""
    fs, inner = filesystem(folder)
    if not is_remote(folder):
        try:
            with os.scandir(inner) as entries:
                return {e.name: e.stat().st_size for e in entries if e.name.endswith(suffix) and e.is_file()}
        except FileNotFoundError:
            return {}
    try:
        listing = fs.ls(inner, detail=True, refresh=True)
    except FileNotFoundError:
        return {}
    names = ((entry["name"].rstrip("/").rsplit("/", 1)[-1], entry) for entry in listing)
    return {name: int(entry["size"]) for name, entry in names if name.endswith(suffix) and entry.get("type") == "file"}


def exists(path: str) -> bool:
    fs, inner = filesystem(path)
    return bool(fs.exists(inner))


def size(path: str) -> int:
    fs, inner = filesystem(path)
    return int(fs.size(inner))


def glob(pattern: str) -> list[str]:
    """Sorted full paths (URLs for remote file systems) matching ``pattern``."""
    fs, inner = filesystem(pattern)
    return sorted(_url(fs, p) for p in fs.glob(inner))


def listdir(path: str) -> list[str]:
    """Sorted base names in ``path`` (empty if it does not exist)."""
    fs, inner = filesystem(path)
    if not fs.exists(inner):
        return []
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(inner, detail=False))


def makedirs(path: str) -> None:
    fs, inner = filesystem(path)
    fs.makedirs(inner, exist_ok=True)


def temporary_path(path: str, tmp_dir: str | None = None) -> str:
    """A unique local path to write ``path`` (local) under before it is renamed into place: beside it, or in
    ``tmp_dir`` (created if missing; it must be on the same file system), where a writer killed half-way leaves
    its partial file instead of beside the finished ones."""
    inner = filesystem(path)[1]
    if tmp_dir is None:
        return f"{inner}.tmp-{uuid.uuid4().hex}"
    folder = filesystem(tmp_dir)[1]
    os.makedirs(folder, exist_ok=True)
    return f"{folder}/{inner.rsplit('/', 1)[-1]}.tmp-{uuid.uuid4().hex}"


def write_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` so that ``path`` either does not exist or holds all of it."""
    fs, inner = filesystem(path)
    if is_remote(path):
        # An object store publishes an object only when its upload completes, so a direct write is
        # already all-or-nothing (and object stores have no cheap rename).
        with fs.open(inner, "wb") as f:
            f.write(data)
        return
    parent = inner.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    tmp = temporary_path(path)
    with fs.open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, inner)
