"""Builders shared by the tests of caches (not a test module): a cache job over tests/cache_tasks.py, its files.

``build`` runs a real Beam job (in-process unless ``beam_args`` say otherwise): a test that calls it is slow.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from taskdata.beam.job import CacheOptions, CacheResult, run_cache_job
from taskdata.cache.format import load_manifest
from taskdata.cache.reader import CacheReader
from taskdata.cache.tfrecord import iter_records
from taskdata.define.registry import Registry
from taskdata.example import decode_example
from taskdata.example.packing import unpack_row

__all__ = [
    "MODULE",
    "Killed",
    "build",
    "examples_by_id",
    "files_of",
    "origins",
    "records_of",
    "sequential_records",
]

MODULE = "tests.cache_tasks"


class Killed(BaseException):
    """Stands for SIGKILL at one exact moment: nothing after it runs."""


def build(output, task="toy_det", seed=0, beam_args=(), logs=None, **kwargs) -> CacheResult:
    """Builds ``task`` of tests/cache_tasks.py into ``output``; ``logs``, a list, collects the job's lines."""
    registry = Registry()
    registry.load_module(MODULE)
    options = CacheOptions(task=task, output=str(output), seed=seed, modules=(MODULE,), beam_args=tuple(beam_args),
                           progress=False, **kwargs)
    return run_cache_job(options, registry, log=(logs.append if logs is not None else lambda m: None))


def files_of(version_dir: str) -> dict[str, bytes]:
    root = Path(version_dir)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def records_of(version_dir: str, split: str = "train") -> list[bytes]:
    manifest = load_manifest(version_dir)
    out = []
    for shard in manifest.split(split).shards:
        with open(os.path.join(version_dir, shard.file), "rb") as f:
            out.extend(iter_records(f, shard.file))
    return out


def sequential_records(version_dir: str, split: str = "train") -> list[list[bytes]]:
    """Every record of every shard, read front to back without the offsets sidecars."""
    reader = CacheReader(version_dir)
    shards = []
    for shard in range(len(reader.record_counts(split))):
        with open(reader.shard_path(split, shard), "rb") as f:
            shards.append(list(iter_records(f, "shard")))
    return shards


def origins(example: dict) -> np.ndarray:
    """A decoded record's provenance/origin as [examples, 4]: source shard, ordinal, first document, documents after it."""
    return example["provenance/origin"].reshape(-1, 4)


def examples_by_id(version_dir, split="train"):
    """(source shard, ordinal) -> (inputs, targets) of every example, unpacking packed rows."""
    manifest = load_manifest(version_dir)
    out = {}
    for record in records_of(version_dir, split):
        row = decode_example(record)
        ids = [tuple(origin) for origin in origins(row)[:, :2].tolist()]
        parts = unpack_row(row, manifest.packed_features, len(ids)) if manifest.packing else [row]
        for key, part in zip(ids, parts, strict=True):
            assert key not in out, f"example {key} is stored twice"
            out[key] = (part["inputs"].tolist(), part["targets"].tolist())
    return out
