"""Counter-based random numbers for many examples at once, each keyed by its stable id.

``ctx.rng(stage, ordinal)`` builds one numpy Generator per example, which costs ~10 microseconds: too
slow for span corruption, which must cost a few microseconds per 568-token chunk. Here the same idea
is vectorized. One ``derive_seed`` call per (shard, stage) gives a stream key; the key of example
``ordinal`` is output number ``ordinal`` of a SplitMix64 generator seeded with the stream key, and the
random word number ``counter`` of that example is output number ``counter`` of a SplitMix64 generator
seeded with the example key (``taskdata.splitmix64``: output ``i`` of seed ``s`` is ``mix64(s + (i + 1) * GAMMA)``),
so any word is computed directly from (seed, task, split, shard, stage, ordinal, counter): nothing
depends on how examples are batched, on which worker, or in which order.
"""

from __future__ import annotations

import numpy as np

from taskdata import splitmix64
from taskdata.preprocessors.base import ShardContext
from taskdata.seeding import derive_seed

__all__ = ["example_keys", "random_words", "stream_key", "uniform_below"]

_S32 = np.uint64(32)


def stream_key(ctx: ShardContext, stage: str) -> int:
    """The 64-bit key of preprocessor ``stage``'s random stream in this shard (one blake2b hash)."""
    return derive_seed(ctx.seed, ctx.task, ctx.split, ctx.shard_index, stage)


def example_keys(key: int, ordinals: np.ndarray) -> np.ndarray:
    """Per-example keys (uint64) for examples ``ordinals`` of the stream with key ``key``."""
    return splitmix64.outputs(np.full(np.shape(ordinals), key, dtype=np.uint64), np.asarray(ordinals))


def random_words(keys: np.ndarray, counters: np.ndarray | int) -> np.ndarray:
    """Word ``counters`` of examples ``keys`` (uint64), broadcast: ``keys[:, None]`` gives a table."""
    return splitmix64.outputs(np.asarray(keys, dtype=np.uint64), np.asarray(counters))


def uniform_below(words: np.ndarray, bound: np.ndarray | int) -> np.ndarray:
    """Integers uniform in ``[0, bound)`` from random words (Lemire's multiply-shift on the top 32 bits).

    ``bound`` must be in [1, 2**32); the bias is at most bound / 2**32 (below 1e-6 for our bounds).
    Integer arithmetic only, so the result is the same on every machine.
    """
    return (((words >> _S32) * np.asarray(bound, dtype=np.uint64)) >> _S32).astype(np.int64)
