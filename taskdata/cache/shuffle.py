"""The global shuffle as pure functions: a keyed hash per example, shards by key range.

Every example's key is a keyed 64-bit hash of (seed, stable id); shard ``d`` of ``n`` holds the keys in
``[d * 2**64 / n, (d + 1) * 2**64 / n)``, sorted. Reading shard 0, then 1, ... then gives one uniformly
random global order that depends on nothing but the seed and the stable ids: not on the runner, the
number of workers, or the order in which Beam happened to process things.
"""

from __future__ import annotations

import functools
import hashlib
import struct

from taskdata.seeding import seed_hasher, stable_id_bytes

__all__ = ["shard_of_key", "shuffle_key", "shuffle_keys"]


def shuffle_key(seed: int, task: str, split: str, source_shard: int, ordinal: int) -> int:
    """The position-defining key of example ``ordinal`` of ``source_shard`` (unsigned 64-bit): ``derive_seed(seed,
    "shuffle", task, split, source_shard, ordinal)``."""
    hasher = _source_shard_hasher(seed, task, split, source_shard).copy()
    hasher.update(stable_id_bytes(ordinal))
    return int.from_bytes(hasher.digest(), "little")


def shuffle_keys(seed: int, task: str, split: str, source_shard: int, first_ordinal: int, count: int) -> list[int]:
    """``shuffle_key`` of examples ``first_ordinal``, ``first_ordinal + 1``, ... (``count`` of them)."""
    prefix = _source_shard_hasher(seed, task, split, source_shard)
    keys = []
    for ordinal in range(first_ordinal, first_ordinal + count):
        hasher = prefix.copy()
        hasher.update(b"i" + _INT64.pack(ordinal))  # stable_id_bytes(ordinal), without its checks per example
        keys.append(int.from_bytes(hasher.digest(), "little"))
    return keys


_INT64 = struct.Struct("<q")


# The cache job keys every example of a source shard in a row: the hash of their common prefix is kept.
# typed: True and 1 are different seeds to check_seed (True is refused), so they must not share an entry.
@functools.lru_cache(maxsize=64, typed=True)
def _source_shard_hasher(seed: int, task: str, split: str, source_shard: int) -> hashlib.blake2b:
    return seed_hasher(seed, "shuffle", task, split, source_shard)


def shard_of_key(key: int, num_shards: int) -> int:
    """The key-range bucket of ``key``: ``floor(key * num_shards / 2**64)``."""
    if not 0 <= key < 2**64:
        raise ValueError(f"A shuffle key must be an unsigned 64-bit integer but got {key}.")
    if num_shards <= 0:
        raise ValueError(f"Number of shards must be a positive integer but got {num_shards}.")
    return (key * num_shards) >> 64
