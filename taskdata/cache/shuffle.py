"""The global shuffle as pure functions: a keyed hash per example, shards by key range.

Every example's key is a keyed 64-bit hash of (seed, stable id); shard ``d`` of ``n`` holds the keys in
``[d * 2**64 / n, (d + 1) * 2**64 / n)``, sorted. Reading shard 0, then 1, ... then gives one uniformly
random global order that depends on nothing but the seed and the stable ids: not on the runner, the
number of workers, or the order in which Beam happened to process things.
"""

from __future__ import annotations

from taskdata.seeding import derive_seed

__all__ = ["shard_of_key", "shuffle_key"]


def shuffle_key(seed: int, task: str, split: str, source_shard: int, ordinal: int) -> int:
    """The position-defining key of example ``ordinal`` of ``source_shard`` (unsigned 64-bit)."""
    return derive_seed(seed, "shuffle", task, split, source_shard, ordinal)


def shard_of_key(key: int, num_shards: int) -> int:
    """The key-range bucket of ``key``: ``floor(key * num_shards / 2**64)``."""
    if not 0 <= key < 2**64:
        raise ValueError(f"A shuffle key must be an unsigned 64-bit integer but got {key}.")
    if num_shards <= 0:
        raise ValueError(f"Number of shards must be a positive integer but got {num_shards}.")
    return (key * num_shards) >> 64
