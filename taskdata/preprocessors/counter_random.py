"""Counter-based random numbers for many examples at once, each keyed by its stable id.

``ctx.rng(stage, ordinal)`` builds one numpy Generator per example, which costs ~10 microseconds: too
slow for span corruption, which must cost a few microseconds per 568-token chunk. Here the same idea
is vectorized. One ``derive_seed`` call per (shard, stage) gives a stream key; the key of example
``ordinal`` is output number ``ordinal`` of a SplitMix64 generator seeded with the stream key, and the
random word number ``counter`` of that example is output number ``counter`` of a SplitMix64 generator
seeded with the example key. SplitMix64 output ``i`` of seed ``s`` is ``mix64(s + (i + 1) * GAMMA)``,
so any word is computed directly from (seed, task, split, shard, stage, ordinal, counter): nothing
depends on how examples are batched, on which worker, or in which order.
"""

from __future__ import annotations

import numpy as np

from taskdata.preprocessors.base import ShardContext
from taskdata.seeding import derive_seed

__all__ = ["example_keys", "mix64", "random_words", "stream_key", "uniform_below"]

# SplitMix64's increment (2**64 / golden ratio) and the finalizer constants of Steele et al. (2014).
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a uint64 array (a bijection with full avalanche); modifies ``z``."""
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def stream_key(ctx: ShardContext, stage: str) -> int:
    """The 64-bit key of preprocessor ``stage``'s random stream in this shard (one blake2b hash)."""
    return derive_seed(ctx.seed, ctx.task, ctx.split, ctx.shard_index, stage)


def _splitmix_outputs(seeds: np.ndarray, indices: np.ndarray) -> np.ndarray:
    # uint64 arithmetic wraps modulo 2**64, which is what SplitMix64 needs.
    return mix64(seeds + (indices.astype(np.uint64) + np.uint64(1)) * _GAMMA)


def example_keys(key: int, ordinals: np.ndarray) -> np.ndarray:
    """Per-example keys (uint64) for examples ``ordinals`` of the stream with key ``key``."""
    return _splitmix_outputs(np.full(np.shape(ordinals), key, dtype=np.uint64), np.asarray(ordinals))


def random_words(keys: np.ndarray, counters: np.ndarray | int) -> np.ndarray:
    """Word ``counters`` of examples ``keys`` (uint64), broadcast: ``keys[:, None]`` gives a table."""
    return _splitmix_outputs(np.asarray(keys, dtype=np.uint64), np.asarray(counters))


def uniform_below(words: np.ndarray, bound: np.ndarray | int) -> np.ndarray:
    """Integers uniform in ``[0, bound)`` from random words (Lemire's multiply-shift on the top 32 bits).

    ``bound`` must be in [1, 2**32); the bias is at most bound / 2**32 (below 1e-6 for our bounds).
    Integer arithmetic only, so the result is the same on every machine.
    """
    return (((words >> _S32) * np.asarray(bound, dtype=np.uint64)) >> _S32).astype(np.int64)
