"""Helpers shared by the index math's tests (not a test module): a cache's shard table held in memory."""

from __future__ import annotations

import numpy as np

__all__ = ["MemoryTable"]


class MemoryTable:
    """A ``ShardTable`` in memory: record ``r`` of shard ``s`` takes 16 + (7s + 3r) % 41 bytes."""

    def __init__(self, task: str, counts: tuple[int, ...], version: str = "v1"):
        self.task, self.version = task, version
        self.shard_uris = tuple(
            f"mem://{task}/{version}/train-{s:05d}-of-{len(counts):05d}" for s in range(len(counts))
        )
        self.offsets = [
            np.concatenate(([0], np.cumsum([16 + (7 * s + 3 * r) % 41 for r in range(n)]))).astype(np.int64)
            for s, n in enumerate(counts)
        ]

    def byte_range(self, shard: int, first: int, count: int) -> tuple[int, int]:
        table = self.offsets[shard]
        return int(table[first]), int(table[first + count] - table[first])

    def byte_ranges(self, shards, firsts, counts):
        pairs = [
            self.byte_range(s, f, c)
            for s, f, c in zip(shards.tolist(), firsts.tolist(), counts.tolist(), strict=True)
        ]
        return np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64)
