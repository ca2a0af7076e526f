"""``taskdata verify``: re-read every shard of a cache version and check it against its manifest.

Checks, per shard: the file exists; its offsets sidecar is intact and matches the manifest; every
record's framing matches the sidecar, its stored data CRC is the one the sidecar lists for its index
(the record is where the build put it) and both CRCs match its bytes; the record count, byte size and
sha256 match the manifest. The first problem is reported with the shard, the record index and the byte offset.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from taskdata import fs
from taskdata.cache.format import Manifest, ShardEntry, load_manifest

__all__ = ["verify_shards", "verify_version"]


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
