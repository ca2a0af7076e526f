"""``taskdata verify``: re-read every shard of a cache version and check it against its manifest.

Checks, per shard: the file exists; its offsets sidecar is intact and matches the manifest; every
record's framing matches the sidecar, its stored data CRC is the one the sidecar lists for its index
(the record is where the build put it) and both CRCs match its bytes; the record count, byte size and
sha256 match the manifest. The first problem is reported with the shard, the record index and the byte offset.
A cache root (``taskdata cache --output ROOT``) is verified task by task: each task's CURRENT version.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

from taskdata import fs
from taskdata.cache.format import (
    CURRENT,
    CacheFormatError,
    Manifest,
    ShardEntry,
    current_version,
    load_manifest,
)
from taskdata.names import InvalidNameError, validate_name

__all__ = ["TaskVerification", "task_folders", "verify_current", "verify_shards", "verify_version"]


def verify_shards(version_dir: str, manifest: Manifest, on_shard: Callable[[str], None] | None = None,
                  stop_at_first: bool = True) -> list[str]:
    """Problems found (empty when everything verifies). Memory stays bounded by a read chunk."""
    problems: list[str] = []
    for split_name, split in sorted(manifest.splits.items()):
        for entry in split.shards:
            problem = _check_shard(version_dir, split_name, entry)
            if problem:
                problems.append(problem)
                if stop_at_first:
                    return problems
            elif on_shard is not None:
                on_shard(entry.file)
    return problems


def _check_shard(version_dir: str, split_name: str, entry: ShardEntry) -> str | None:
    from taskdata.cache.shard_reader import verify_shard
    from taskdata.cache.tfrecord import CorruptRecordError, read_record_index

    path = fs.join(version_dir, entry.file)
    offsets_path = fs.join(version_dir, entry.offsets_file)
    if not fs.exists(path):
        return f"shard {entry.file} of split {split_name!r} is missing"
    if not fs.exists(offsets_path):
        return f"offsets sidecar {entry.offsets_file} of shard {entry.file} is missing"
    offsets_data = fs.read_bytes(offsets_path)
    if hashlib.sha256(offsets_data).hexdigest() != entry.offsets_sha256:
        return f"shard {entry.file}: offsets sidecar {entry.offsets_file} does not match its checksum in the manifest"
    try:
        index = read_record_index(offsets_data, offsets_path)
        summary = verify_shard(path, index, entry.records, entry.sha256, max_record_bytes=entry.max_record_bytes)
    except CorruptRecordError as e:
        return f"shard {entry.file}: record {e.record_index} at byte offset {e.byte_offset}: {e.reason}"
    except ValueError as e:
        return f"shard {entry.file}: {e}"
    if summary.size_bytes != entry.bytes:
        return f"shard {entry.file} has {summary.size_bytes} bytes but the manifest says {entry.bytes}"
    return None


def verify_version(version_dir: str, on_shard: Callable[[str], None] | None = None) -> list[str]:
    """Verifies a complete version (manifest, COMPLETED marker and every shard)."""
    return verify_shards(version_dir, load_manifest(version_dir), on_shard=on_shard)


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


def verify_current(root: str, task: str) -> TaskVerification:
    """Verifies the CURRENT version of ``{root}/{task}``; any problem (a damaged pointer or manifest too)
    is reported in the result, never raised, so that a whole root can be checked task by task."""
    version_dir = None
    checked: list[str] = []
    try:
        version_dir = current_version(fs.join(root, task))
        if version_dir is None:
            return TaskVerification(task, None, 0, f"{fs.join(root, task)} has no {CURRENT} pointer")
        problems = verify_version(version_dir, on_shard=checked.append)
    except (CacheFormatError, OSError, ValueError) as e:
        problems = [str(e)]
    return TaskVerification(task, version_dir, len(checked), problems[0] if problems else None)
