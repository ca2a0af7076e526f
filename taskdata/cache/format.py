"""The on-disk layout of a cache and its manifest.

::

    {root}/{task}/CURRENT                         name of the newest complete version (moved last)
    {root}/{task}/{version}/                      one build; seqio can read it as a cached task
        {split}.tfrecord-00000-of-00004           tf.train.Example records in global shuffled order
        index/{split}.tfrecord-00000-of-00004.offsets   byte offset and data CRC of every record
        index/{split}.tfrecord-00000-of-00004.origins   every record's provenance/origin (format 4, unpacked)
        info.{split}.json, stats.{split}.json     seqio's feature info and statistics
        manifest.json                             everything below, hashed by COMPLETED
        COMPLETED                                 written last: {"manifest_sha256": ...}

A version without ``COMPLETED`` (or whose ``COMPLETED`` does not match its manifest) is not a cache:
it is what a crashed build leaves, and nothing reads it. Offsets live in a subfolder so that seqio's
``{split}.tfrecord-*-of-*`` pattern matches only the record files.

The origins sidecars (``taskdata.cache.origins``) repeat what the records' ``provenance/origin`` say, so
that the ledger answers without reading records. A split lists them (``"origins"``, with their sha256)
beside its shards, not in the shard entries: a reader that predates them reads the manifest, verifies
and reads the cache as before (it ignores keys it does not know), so they need no new format. Caches
built before them have no ``"origins"``, and the ledger reads those records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from taskdata import cas, fs
from taskdata.fingerprint import canonical_json
from taskdata.names import validate_name

__all__ = [
    "CURRENT",
    "FORMAT",
    "FORMAT_PACKED",
    "FORMAT_SEQIO_PROVENANCE",
    "CacheFormatError",
    "Manifest",
    "ShardEntry",
    "SidecarEntry",
    "SplitManifest",
    "completed_path",
    "current_version",
    "find_version",
    "is_version_name",
    "list_versions",
    "load_manifest",
    "manifest_bytes",
    "offsets_name",
    "origins_name",
    "shard_name",
    "task_dir",
]

# 2: offsets sidecars hold every record's data CRC, so a reader proves each record is at its index.
# Records carry seqio-style provenance features (taskdata.cache.provenance). Read, no longer written.
FORMAT_SEQIO_PROVENANCE = "taskdata.cache/2"
# 3: format 2 plus a "packing" section: every record is a packed row of several examples
# (taskdata.example.packing). Read, no longer written.
FORMAT_PACKED = "taskdata.cache/3"
# 4: what a cache job writes: compact provenance, one small int64 feature per record plus each split's
# table of source files here ("source_files"), about a tenth of format 2's provenance bytes
# (taskdata.cache.provenance); a "packing" section where the records are packed rows. A reader that knows
# only formats 2 and 3 refuses it, as it would misread the provenance.
FORMAT = "taskdata.cache/4"
_FORMATS = (FORMAT_SEQIO_PROVENANCE, FORMAT_PACKED, FORMAT)
MANIFEST = "manifest.json"
COMPLETED = "COMPLETED"
CURRENT = "CURRENT"
_VERSION_RE = re.compile(r"v[0-9A-Za-z_-]+")


class CacheFormatError(ValueError):
    """A cache folder that is not a complete, consistent cache version."""


def shard_name(split: str, index: int, num_shards: int) -> str:
    return f"{split}.tfrecord-{index:05d}-of-{num_shards:05d}"


def offsets_name(split: str, index: int, num_shards: int) -> str:
    return f"index/{shard_name(split, index, num_shards)}.offsets"


def origins_name(split: str, index: int, num_shards: int) -> str:
    return f"index/{shard_name(split, index, num_shards)}.origins"


def task_dir(root: str, task_name: str) -> str:
    # The name is validated here too: a name becomes part of a path only through a checked lookup.
    return fs.join(root, validate_name(task_name, kind="task"))


def completed_path(version_dir: str) -> str:
    return fs.join(version_dir, COMPLETED)


@dataclasses.dataclass(frozen=True)
class ShardEntry:
    """One record file: its name, record count, byte size and checksums."""

    file: str
    records: int
    bytes: int
    sha256: str
    offsets_file: str
    offsets_sha256: str
    max_record_bytes: int

    def __post_init__(self) -> None:
        if self.records < 0 or self.bytes < 0 or self.max_record_bytes < 0:
            raise CacheFormatError(f"Shard {self.file!r} has a negative count or size: {self}.")
        if self.records == 0 and self.bytes != 0:
            raise CacheFormatError(f"Shard {self.file!r} has no records but {self.bytes} bytes.")


@dataclasses.dataclass(frozen=True)
class SidecarEntry:
    """A sidecar file beside one shard (its origins: ``taskdata.cache.origins``), its sha256 and its size.

    The size lets ``taskdata verify --level listing`` prove the sidecar whole from the listing of ``index/``
    without reading it (the ledger checks the sha256 when it first reads one, and ``full`` reads them all)."""

    file: str
    sha256: str
    bytes: int

    def __post_init__(self) -> None:
        named = re.fullmatch(r"index/[\w.-]+", self.file) is not None and ".." not in self.file
        if not named or re.fullmatch(r"[0-9a-f]{64}", self.sha256) is None:
            raise CacheFormatError(f"A sidecar entry names a file directly under index/ and its sha256 (64 hex "
                                   f"digits) but got {self}.")
        if isinstance(self.bytes, bool) or not isinstance(self.bytes, int) or self.bytes < 0:
            raise CacheFormatError(f"Sidecar entry {self.file} must give its size as a non-negative integer "
                                   f"number of bytes but got {self.bytes!r}.")


@dataclasses.dataclass(frozen=True)
class SplitManifest:
    shards: tuple[ShardEntry, ...]
    source_shards: int
    counters: Mapping[str, int]
    # The file name of every source shard, by source shard index (format 4; None in formats 2 and 3,
    # whose records carry their source file's name).
    source_files: tuple[str, ...] | None = None
    # Each shard's origins sidecar, by shard index (format 4 caches of examples built since they exist; None
    # in caches built before them, and in packed caches and formats 2 and 3, whose records are read instead).
    origins: tuple[SidecarEntry, ...] | None = None

    def __post_init__(self) -> None:
        if self.source_files is not None and len(self.source_files) != self.source_shards:
            raise CacheFormatError(f"A split of {self.source_shards} source shards lists {len(self.source_files)} "
                                   "source files; it must list one per source shard.")
        if self.origins is not None and len(self.origins) != len(self.shards):
            raise CacheFormatError(f"A split of {len(self.shards)} shards lists {len(self.origins)} origins "
                                   "sidecars; it must list one per shard.")

    @property
    def num_records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def record_counts(self) -> tuple[int, ...]:
        return tuple(s.records for s in self.shards)

    @property
    def max_record_bytes(self) -> int:
        return max((s.max_record_bytes for s in self.shards), default=0)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to trust and locate the records of one cache version."""

    task: str
    task_fingerprint: str
    fingerprints: Mapping[str, str]
    seed: int
    taskdata_version: str
    sequence_length: Mapping[str, int]
    features: Mapping[str, Mapping[str, Any]]
    splits: Mapping[str, SplitManifest]
    # {"lengths": {feature: row length}, "open_rows": n} for a cache of packed rows, else None.
    packing: Mapping[str, Any] | None = None
    format: str = FORMAT

    def __post_init__(self) -> None:
        if self.packing is not None and (set(self.packing) != {"lengths", "open_rows"} or not self.packing["lengths"]):
            raise CacheFormatError(f"Cache of task {self.task!r}: packing must be {{'lengths': {{...}}, 'open_rows': n}} "
                                   f"but is {self.packing!r}.")
        if self.format not in _FORMATS:
            raise CacheFormatError(f"Cache of task {self.task!r}: format {self.format!r} is none of {list(_FORMATS)}.")
        if self.format != FORMAT and (self.packing is not None) != (self.format == FORMAT_PACKED):
            raise CacheFormatError(f"Cache of task {self.task!r}: format {self.format!r} "
                                   f"{'needs' if self.packing is None else 'has no place for'} a packing section.")
        tables = {name: split.source_files is not None for name, split in self.splits.items()}
        if any(listed != self.compact_provenance for listed in tables.values()):
            raise CacheFormatError(
                f"Cache of task {self.task!r}, format {self.format!r}: every split "
                f"{'needs' if self.compact_provenance else 'has no place for'} a table of source files "
                f"(splits with one: {sorted(name for name, listed in tables.items() if listed)}).")
        with_origins = sorted(name for name, split in self.splits.items() if split.origins is not None)
        if with_origins and (not self.compact_provenance or self.packing is not None):
            raise CacheFormatError(
                f"Cache of task {self.task!r}, format {self.format!r}{', packed' if self.packing else ''}: splits "
                f"{with_origins} list origins sidecars, which only a format {FORMAT} cache of examples (not packed "
                "rows) has.")

    @property
    def compact_provenance(self) -> bool:
        """Whether records carry ``provenance/origin`` (format 4) rather than seqio-style features (2 and 3)."""
        return self.format == FORMAT

    @property
    def packed_features(self) -> tuple[str, ...]:
        """The features packed into rows (empty for a cache of examples)."""
        return tuple(self.packing["lengths"]) if self.packing is not None else ()

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": self.format,
            "task": self.task,
            "task_fingerprint": self.task_fingerprint,
            "fingerprints": dict(self.fingerprints),
            "seed": self.seed,
            "taskdata_version": self.taskdata_version,
            "sequence_length": dict(self.sequence_length),
            "features": {k: dict(v) for k, v in self.features.items()},
            "splits": {
                name: {
                    "num_shards": len(split.shards),
                    "num_records": split.num_records,
                    "source_shards": split.source_shards,
                    "counters": dict(sorted(split.counters.items())),
                    "shards": [dataclasses.asdict(s) for s in split.shards],
                    **({} if split.source_files is None else {"source_files": list(split.source_files)}),
                    **({} if split.origins is None else {"origins": [dataclasses.asdict(o) for o in split.origins]}),
                }
                for name, split in sorted(self.splits.items())
            },
        }
        if self.packing is not None:
            out["packing"] = {"lengths": dict(self.packing["lengths"]), "open_rows": self.packing["open_rows"]}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "manifest") -> Manifest:
        if data.get("format") not in _FORMATS:
            raise CacheFormatError(
                f"{where}: format is {data.get('format')!r}, expected one of {list(_FORMATS)}: the version was "
                f"built by another taskdata. Rebuild it with 'taskdata cache --task {data.get('task')} --force'.")
        try:
            splits = {
                name: SplitManifest(
                    shards=tuple(ShardEntry(**s) for s in split["shards"]),
                    source_shards=int(split["source_shards"]),
                    counters=dict(split["counters"]),
                    source_files=tuple(split["source_files"]) if "source_files" in split else None,
                    origins=tuple(_sidecar_entry(o) for o in split["origins"]) if "origins" in split else None,
                )
                for name, split in data["splits"].items()
            }
            return cls(
                task=data["task"], task_fingerprint=data["task_fingerprint"],
                fingerprints=dict(data["fingerprints"]), seed=int(data["seed"]),
                taskdata_version=data["taskdata_version"], sequence_length=dict(data["sequence_length"]),
                features=dict(data["features"]), splits=splits,
                packing=dict(data["packing"]) if "packing" in data else None, format=data["format"],
            )
        except (KeyError, TypeError) as e:
            raise CacheFormatError(f"{where}: malformed manifest ({e!r}).") from e
        except CacheFormatError as e:
            raise CacheFormatError(f"{where}: {e}") from None

    def split(self, name: str) -> SplitManifest:
        try:
            return self.splits[name]
        except KeyError:
            raise CacheFormatError(
                f"Cache of task {self.task!r} has no split {name!r}; it has {sorted(self.splits)}."
            ) from None


def manifest_bytes(manifest: Manifest) -> bytes:
    return (json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n").encode("utf-8")


def completed_bytes(manifest_data: bytes) -> bytes:
    return (canonical_json({"manifest_sha256": hashlib.sha256(manifest_data).hexdigest()}) + "\n").encode()


def load_manifest(version_dir: str) -> Manifest:
    """The manifest of a COMPLETE version; anything else is a CacheFormatError saying what is wrong."""
    marker = completed_path(version_dir)
    # Both at once: from an object store, one round trip.
    found, data = fs.read_many([marker, fs.join(version_dir, MANIFEST)])
    if found is None:
        raise CacheFormatError(
            f"{version_dir} is not a complete cache: it has no {COMPLETED} marker (a build that did not "
            "finish, or is still running). Rebuild with 'taskdata cache'."
        )
    if data is None:
        raise FileNotFoundError(fs.join(version_dir, MANIFEST))
    if found != completed_bytes(data):
        raise CacheFormatError(
            f"{version_dir}: {MANIFEST} does not match the hash in {COMPLETED}; the cache was modified after "
            "it was built. Run 'taskdata verify' and rebuild."
        )
    return Manifest.from_json(json.loads(data), where=fs.join(version_dir, MANIFEST))


def list_versions(task_root: str) -> list[str]:
    """Version folder names under ``{root}/{task}``, oldest first (names sort by build time)."""
    return [n for n in fs.listdir(task_root) if _VERSION_RE.fullmatch(n)]


def find_version(task_root: str, manifest_sha256: str) -> str | None:
    """The complete version under ``task_root`` whose COMPLETED marker holds ``manifest_sha256``.

    CURRENT is tried first, then the other versions newest first; a version without a readable
    COMPLETED marker (a build that did not finish) is never returned.
    """
    current = current_version(task_root)
    candidates = [current] if current is not None else []
    candidates += [fs.join(task_root, v) for v in reversed(list_versions(task_root)) if fs.join(task_root, v) != current]
    for version_dir in candidates:
        try:
            marker = json.loads(fs.read_bytes(completed_path(version_dir)))
        except (OSError, ValueError):
            continue
        if isinstance(marker, dict) and marker.get("manifest_sha256") == manifest_sha256:
            return version_dir
    return None


def current_version(task_root: str) -> str | None:
    """The version folder the task's CURRENT pointer names, or None without one.

    Read as the pointer's writers read it (``taskdata.cas``), never from a listing a client may have kept."""
    pointer = fs.join(task_root, CURRENT)
    data = cas.read(pointer).data
    if data is None:
        return None
    name = data.decode("utf-8", "replace").strip()
    if not is_version_name(name):
        raise CacheFormatError(f"{pointer} names {name!r}, which is not a version folder name.")
    return fs.join(task_root, name)


def is_version_name(name: str) -> bool:
    return _VERSION_RE.fullmatch(name) is not None


def _sidecar_entry(entry: Mapping[str, Any]) -> SidecarEntry:
    # Manifests written before sidecar sizes were recorded (never released) list no "bytes": rebuild them.
    if set(entry) != {"file", "sha256", "bytes"}:
        raise CacheFormatError(f"An origins sidecar entry must have exactly the keys file, sha256 and bytes but "
                               f"got {sorted(entry)} ({dict(entry)}); a cache built before sidecar sizes were "
                               "recorded must be rebuilt with 'taskdata cache'.")
    return SidecarEntry(entry["file"], entry["sha256"], entry["bytes"])
