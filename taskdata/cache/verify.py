"""``taskdata verify``: check a cache version against its manifest, at one of two levels.

``full`` (``taskdata verify``, the cache job before it commits, the server's default first-use check)
re-reads every byte. Per shard: the file exists; its offsets sidecar (and its origins sidecar, where the
manifest lists one: ``taskdata.cache.origins``) is intact and matches its sha256 in the manifest; every
record's framing matches the sidecar, its stored data CRC is the one the sidecar lists
for its index (the record is where the build put it) and both CRCs match its bytes; the record count,
byte size and sha256 match the manifest. The first problem is reported with the shard, the record
index and the byte offset. Shards are checked by ``workers`` threads (file reads, sha256 and CRC32C
release the GIL), results taken in manifest order, so the problem reported is the same for any count.

``listing`` (``taskdata verify --level listing``, the server's first-use check at pod scale) reads no
record and no origins sidecar. From one listing of the shards' folder and, where the manifest lists
origins sidecars, one of ``index/``: every shard has exactly the manifest's byte size, and every origins
sidecar exists with the byte size the build recorded (``SidecarEntry.bytes``); every offsets sidecar is
read (gcsfs fetches them concurrently) and matches its sha256 in the manifest. Together with ``COMPLETED``
(the manifest is the one the build committed, after its own full verification) it proves: no file is
missing, truncated or extended since the build, and every byte offset and record CRC served is the
build's. An origins sidecar edited in place at the same size is not caught here: only the ledger needs
them, and it checks each one's sha256 when it first reads it (``CacheReader.shard_origins``); ``full``
hashes them all. It does not prove that a shard's bytes are unchanged (a flipped bit, two equal-length records
swapped): the reader finds those, record by record, before a record reaches a batch (both CRCs, and
the stored data CRC against the sidecar's, which this level proved is the build's), and ``full`` finds
them for the whole version.

A cache root (``taskdata cache --output ROOT``) is verified task by task: each task's CURRENT version.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, TypeVar, get_args

import numpy as np

from taskdata import fs
from taskdata.cache.format import (
    CURRENT,
    CacheFormatError,
    Manifest,
    ShardEntry,
    SidecarEntry,
    SplitManifest,
    current_version,
    load_manifest,
)
from taskdata.cache.tfrecord import RecordIndex
from taskdata.names import InvalidNameError, validate_name

__all__ = [
    "Level",
    "SplitCheck",
    "TaskVerification",
    "check_split",
    "task_folders",
    "verify_current",
    "verify_shards",
    "verify_version",
]

Level = Literal["listing", "full"]
# Sidecars fetched per request batch: bounds the raw bytes held at once (12 bytes per record).
_SIDECAR_BATCH = 4096
_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclasses.dataclass(frozen=True)
class SplitCheck:
    """What checking one split found: each shard's record offsets (its sidecar's table: record starts,
    then the file length), in manifest order, and the problems (``offsets`` is empty unless there are none)."""

    level: Level
    offsets: tuple[np.ndarray, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_split(
    version_dir: str,
    split_name: str,
    split: SplitManifest,
    *,
    level: Level = "full",
    workers: int = 1,
    on_shard: Callable[[str], None] | None = None,
    stop_at_first: bool = True,
) -> SplitCheck:
    """Checks one split of a version at ``level`` (see the module's docstring for what each proves)."""
    if level not in get_args(Level):
        raise ValueError(f"Verification level must be one of {get_args(Level)} but got {level!r}.")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer but got {workers!r}.")
    entries = split.shards
    # One listing per folder of shards (sidecars need none: a missing one is found by reading it).
    listed = {folder: fs.sizes_in(fs.join(version_dir, folder) if folder else version_dir)
              for folder in {_folder(e.file) for e in entries}}
    # The first problem of each shard, in manifest order; None while it is fine so far.
    problems: list[str | None] = [_listing_problem(split_name, e, listed, level) for e in entries]
    offsets: list[np.ndarray | None] = [None] * len(entries)
    indexes: list[RecordIndex | None] = [None] * len(entries)
    readable = [i for i, problem in enumerate(problems) if problem is None]
    prefix = version_dir.rstrip("/") + "/"  # fs.join per path costs seconds at 65,536 shards
    origins = split.origins
    # Only full reads origins sidecars (the ledger hashes each on first use); listing sizes them from one
    # listing of index/, which keeps a pod-scale first use from reading a second small file per shard.
    read_origins_too = origins is not None and level == "full"
    index_sizes = fs.sizes_in(prefix + "index", ".origins") if origins is not None and level == "listing" else {}
    for at in range(0, len(readable), _SIDECAR_BATCH):
        batch = readable[at : at + _SIDECAR_BATCH]
        paths = [prefix + entries[i].offsets_file for i in batch]
        origin_paths = [prefix + origins[i].file for i in batch] if read_origins_too else []  # type: ignore[index]
        sidecars = fs.read_many(paths + origin_paths)  # one batch of requests for both kinds of sidecar
        origin_data = sidecars[len(paths):] if read_origins_too else [None] * len(batch)
        for i, path, data, origin in zip(batch, paths, sidecars[: len(paths)], origin_data, strict=True):
            problems[i] = _sidecar_problem(entries[i], data)
            if problems[i] is None:
                assert data is not None  # _sidecar_problem names a sidecar that could not be read
                offsets[i], indexes[i], problems[i] = _parse_sidecar(entries[i], path, data, level)
            if problems[i] is None and origins is not None:
                problems[i] = (_origins_problem(entries[i], origins[i], prefix + origins[i].file, origin)
                               if read_origins_too else _origins_size_problem(entries[i], origins[i], index_sizes))
    if level == "full":
        last = len(entries)
        if stop_at_first:  # no shard after the first one found bad needs reading
            last = next((i for i, problem in enumerate(problems) if problem), last)
        todo = [i for i in range(last) if problems[i] is None]
        def content_problem(i: int) -> str | None:
            index = indexes[i]
            assert index is not None  # every shard still without a problem has its sidecar parsed
            return _content_problem(version_dir, entries[i], index)

        results = _in_order(content_problem, todo, workers)
        for i, problem in zip(todo, results, strict=False):
            problems[i] = problem
            if problem and stop_at_first:
                results.close()  # stops the threads' pending shards
                break
    found = tuple(problem for problem in problems if problem)
    # With stop_at_first, shards after the first bad one were not all checked: none counts as verified.
    checked = problems.index(found[0]) if found and stop_at_first else len(entries)
    if stop_at_first:
        found = found[:1]
    if on_shard is not None:
        for entry, problem in zip(entries[:checked], problems, strict=False):
            if problem is None:
                on_shard(entry.file)
    return SplitCheck(level, tuple(offsets) if not found else (), found)  # type: ignore[arg-type]


def verify_shards(version_dir: str, manifest: Manifest, on_shard: Callable[[str], None] | None = None,
                  stop_at_first: bool = True, *, level: Level = "full", workers: int = 1) -> list[str]:
    """Problems found in every split (empty when everything verifies). Memory stays bounded by a read
    chunk per worker (and, at either level, one batch of sidecars)."""
    problems: list[str] = []
    for split_name, split in sorted(manifest.splits.items()):
        check = check_split(version_dir, split_name, split, level=level, workers=workers, on_shard=on_shard,
                            stop_at_first=stop_at_first)
        problems.extend(check.problems)
        if problems and stop_at_first:
            return problems
    return problems


def _folder(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else ""


def _listing_problem(split_name: str, entry: ShardEntry, listed: dict[str, dict[str, int]], level: Level) -> str | None:
    size = listed[_folder(entry.file)].get(entry.file.rsplit("/", 1)[-1])
    if size is None:
        return f"shard {entry.file} of split {split_name!r} is missing"
    if level == "listing" and size != entry.bytes:
        # At full level the content check names the first record the size change damaged instead.
        return (f"shard {entry.file} has {size} bytes but the manifest says {entry.bytes} (the listing check "
                "reads no record: 'taskdata verify' names the first damaged one)")
    return None


def _sidecar_problem(entry: ShardEntry, data: bytes | None) -> str | None:
    if data is None:
        return f"offsets sidecar {entry.offsets_file} of shard {entry.file} is missing"
    if hashlib.sha256(data).hexdigest() != entry.offsets_sha256:
        return (f"shard {entry.file}: offsets sidecar {entry.offsets_file} does not match its checksum in "
                "the manifest")
    return None


def _origins_size_problem(entry: ShardEntry, origins: SidecarEntry, index_sizes: dict[str, int]) -> str | None:
    size = index_sizes.get(origins.file.rsplit("/", 1)[-1])
    if size is None:
        return f"origins sidecar {origins.file} of shard {entry.file} is missing"
    if size != origins.bytes:
        return (f"shard {entry.file}: origins sidecar {origins.file} has {size} bytes but the manifest says "
                f"{origins.bytes} (the listing check reads no origins sidecar: 'taskdata verify' hashes them)")
    return None


def _origins_problem(entry: ShardEntry, origins: SidecarEntry, path: str, data: bytes | None) -> str | None:
    from taskdata.cache.origins import read_origins

    if data is None:
        return f"origins sidecar {origins.file} of shard {entry.file} is missing"
    if hashlib.sha256(data).hexdigest() != origins.sha256:
        return f"shard {entry.file}: origins sidecar {origins.file} does not match its checksum in the manifest"
    try:
        read_origins(data, path, entry.records)
    except ValueError as e:
        return f"shard {entry.file}: {e}"
    return None


def _parse_sidecar(
    entry: ShardEntry, path: str, data: bytes, level: Level
) -> tuple[np.ndarray | None, RecordIndex | None, str | None]:
    """(offsets, the full index at level full, problem) of a sidecar whose sha256 matched the manifest."""
    from taskdata.cache.tfrecord import read_record_index, trusted_offsets

    try:
        index = read_record_index(data, path) if level == "full" else None
        offsets = index.offsets if index is not None else trusted_offsets(data, path)
    except ValueError as e:
        return None, None, f"shard {entry.file}: {e}"
    if len(offsets) != entry.records + 1 or int(offsets[-1]) != entry.bytes:
        return None, None, (f"shard {entry.file}: its offsets sidecar lists {len(offsets) - 1} records in "
                            f"{int(offsets[-1])} bytes but the manifest says {entry.records} in {entry.bytes}")
    return offsets, index, None


def _content_problem(version_dir: str, entry: ShardEntry, index: RecordIndex) -> str | None:
    from taskdata.cache.shard_reader import verify_shard
    from taskdata.cache.tfrecord import CorruptRecordError

    try:
        summary = verify_shard(fs.join(version_dir, entry.file), index, entry.records, entry.sha256,
                               max_record_bytes=entry.max_record_bytes)
    except CorruptRecordError as e:
        return f"shard {entry.file}: record {e.record_index} at byte offset {e.byte_offset}: {e.reason}"
    except ValueError as e:
        return f"shard {entry.file}: {e}"
    if summary.size_bytes != entry.bytes:
        return f"shard {entry.file} has {summary.size_bytes} bytes but the manifest says {entry.bytes}"
    return None


def _in_order(function: Callable[[_T], _R], items: Iterable[_T], workers: int) -> Generator[_R, None, None]:
    """``function`` of each item, yielded in order, computed by ``workers`` threads at most ``2 * workers``
    items ahead of the consumer; closing the iterator cancels what has not started."""
    if workers == 1:
        yield from map(function, items)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="verify")
    try:
        pending = iter(items)
        window = collections.deque(pool.submit(function, item) for item in itertools.islice(pending, 2 * workers))
        while window:
            result = window.popleft().result()
            window.extend(pool.submit(function, item) for item in itertools.islice(pending, 1))
            yield result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def verify_version(version_dir: str, on_shard: Callable[[str], None] | None = None, *, level: Level = "full",
                   workers: int = 1) -> list[str]:
    """Verifies a complete version (manifest, COMPLETED marker and every shard) at ``level``."""
    return verify_shards(version_dir, load_manifest(version_dir), on_shard=on_shard, level=level, workers=workers)


@dataclasses.dataclass(frozen=True)
class TaskVerification:
    """What verifying one task's CURRENT version found: ``problem`` is None when every record verified."""

    task: str
    version_dir: str | None
    shards: int
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def task_folders(root: str) -> list[str]:
    """Names of the task folders (those with a CURRENT pointer) directly under a cache root, sorted."""
    out = []
    for name in fs.listdir(root):
        try:
            validate_name(name, kind="task")  # '_runs' and other folders of the root are not tasks
        except InvalidNameError:
            continue
        if fs.exists(fs.join(root, name, CURRENT)):
            out.append(name)
    return out


def verify_current(root: str, task: str, *, level: Level = "full", workers: int = 1) -> TaskVerification:
    """Verifies the CURRENT version of ``{root}/{task}``; any problem (a damaged pointer or manifest too)
    is reported in the result, never raised, so that a whole root can be checked task by task."""
    version_dir = None
    checked: list[str] = []
    try:
        version_dir = current_version(fs.join(root, task))
        if version_dir is None:
            return TaskVerification(task, None, 0, f"{fs.join(root, task)} has no {CURRENT} pointer")
        problems = verify_version(version_dir, on_shard=checked.append, level=level, workers=workers)
    except (CacheFormatError, OSError, ValueError) as e:
        problems = [str(e)]
    return TaskVerification(task, version_dir, len(checked), problems[0] if problems else None)
