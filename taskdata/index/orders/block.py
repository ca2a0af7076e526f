"""The block epoch order (``block``): each epoch is a keyed shuffle of blocks of contiguous records.

The per-record order (``feistel``) makes every example of a later epoch its own ranged read.
The block order keeps reads long: an epoch of ``n`` records is read as blocks of ``block_size``
records that are contiguous in the cache, in a keyed pseudo-random order of blocks.

One epoch's order, for position ``i`` in ``[0, n)`` of the epoch:

1. rotate: the cache's order is read from a keyed offset ``o`` in ``[0, n)`` on, wrapping around
   (record ``(j + o) mod n`` is the epoch's ``j``-th in rotated order), so that the records that share a
   block change from epoch to epoch instead of being the same ``block_size`` records every epoch;
2. cut the rotated order into ``F = n // block_size`` full blocks and, when ``block_size`` does not
   divide ``n``, one partial block of ``n mod block_size`` records at the end;
3. read the full blocks in the order of a keyed ``FeistelPermutation`` of ``[0, F)`` and the partial
   block last (it holds other records every epoch, as the offset moves).

So ``i`` lies in slot ``s = i // block_size`` at ``w = i % block_size``; its record is
``(perm(s) * block_size + w + o) mod n`` for a full slot and ``(s * block_size + w + o) mod n`` for the
partial one. Both directions are O(1) (the inverse runs the same steps backwards with
``perm.inverse``) and neither depends on anything but (seed, task, epoch, n, block_size): not on
hosts, steps or how far the run has gone.

Within a block the records keep their cache order. The cache is already a keyed uniform shuffle
(the Beam job's global shuffle), so a block is a uniformly random set of records in any one epoch; what
the block order gives up is independence between epochs, measured in ``bench/bench_epoch_order.py``.
A range of ``L`` consecutive positions of one epoch touches at most ``ceil(L / block_size) + 1``
blocks, and each block is at most a few ranged reads (one more per cache-shard boundary inside it,
``extents_per_block``): ``BlockOrder.reads_bound`` states the bound, ``taskdata.index.read_bound`` sums
it over a plan's tasks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from taskdata.index.layout import ShardLayout
from taskdata.index.orders.base import EpochOrder, check_index, check_key, check_option, check_size
from taskdata.index.orders.feistel import FeistelOrder, FeistelPermutation
from taskdata.seeding import derive_seed
from taskdata.splitmix64 import mix64

__all__ = ["BlockOrder", "BlockPermutation", "extents_per_block"]

# Tells the rotation's value apart from the block permutation's key (both come from one derived key).
_OFFSET_TWEAK = 0x6A09E667F3BCC909
# The order of full blocks inside each epoch's block order.
_BLOCKS = FeistelOrder()


@dataclasses.dataclass(frozen=True)
class BlockPermutation:
    """A keyed permutation of ``[0, size)`` that moves blocks of ``block_size`` contiguous values."""

    size: int
    block_size: int
    key: int

    def __post_init__(self) -> None:
        for field, value in (("size", self.size), ("block_size", self.block_size)):
            check_size(value, f"A block permutation's {field}")
        check_key(self.key, "A block permutation key")

    @property
    def full_blocks(self) -> int:
        return self.size // self.block_size

    @functools.cached_property
    def offset(self) -> int:
        """Where in the cache's order the epoch's rotated order starts."""
        return mix64(self.key ^ _OFFSET_TWEAK) % self.size

    @functools.cached_property
    def blocks(self) -> FeistelPermutation:
        """The order of the full blocks (of one block when there are none, never used then)."""
        return FeistelPermutation(size=max(1, self.full_blocks), key=self.key)

    def __call__(self, index: int) -> int:
        self._check(index)
        slot, within = divmod(index, self.block_size)
        block = self.blocks(slot) if slot < self.full_blocks else slot
        rotated = block * self.block_size + within
        return (rotated + self.offset) % self.size

    def inverse(self, value: int) -> int:
        self._check(value)
        block, within = divmod((value - self.offset) % self.size, self.block_size)
        slot = self.blocks.inverse(block) if block < self.full_blocks else block
        return slot * self.block_size + within

    def _check(self, index: int) -> None:
        check_index(index, self.size)


@dataclasses.dataclass(frozen=True)
class BlockOrder(EpochOrder):
    """Each epoch >= 1 of a task reads its records in blocks of ``block_size`` (``BlockPermutation``), so a
    host's reads per step stay bounded: 256 examples in blocks of 64 are at most a handful of reads."""

    kind: ClassVar[str] = "block"
    block_size: int

    vectorised_below: ClassVar[int] = 2**62  # (rotated + offset) below 2 * size

    def __post_init__(self) -> None:
        check_option(self.block_size, "A block epoch order needs a block size (records per block)",
                     "64 keeps a host of 256 examples at a handful of reads per step.")

    def make_permutation(self, seed: int, task: str, epoch: int, size: int) -> BlockPermutation:
        # Its own tag: the block order's keys are not the per-record order's ("epoch_order").
        return BlockPermutation(size=size, block_size=self.block_size, key=derive_seed(seed, "block_order", task, epoch))

    def apply_vectorised(
        self, permutations: Sequence[BlockPermutation], which: np.ndarray, indices: np.ndarray
    ) -> np.ndarray:
        """The blocks of all permutations go through one ``FeistelOrder.apply``."""
        sizes = np.array([p.size for p in permutations], np.int64)[which]
        block_sizes = np.array([p.block_size for p in permutations], np.int64)[which]
        full = np.array([p.full_blocks for p in permutations], np.int64)[which]
        offsets = np.array([p.offset for p in permutations], np.int64)[which]
        slots, within = np.divmod(indices, block_sizes)
        blocks = slots.copy()
        moved = np.flatnonzero(slots < full)
        if moved.size:
            blocks[moved] = _BLOCKS.apply([p.blocks for p in permutations], which[moved], slots[moved])
        # (rotated + offset) mod size without forming a sum beyond int64: both terms are below size.
        values = blocks * block_sizes + within - (sizes - offsets)
        values[values < 0] += sizes[values < 0]
        return values

    def reads_bound(self, layout: ShardLayout, positions: int) -> int:
        """``L`` consecutive positions of a task that cross ``E`` epoch ends touch at most ``ceil(L / K) + 2E +
        1`` blocks of ``K`` records (each epoch's part adds at most one block to ``ceil(part / K)``, and the
        parts' ceilings add at most ``E``), with ``E <= ceil((L - 1) / n)``; a block is at most
        ``extents_per_block`` reads. Epoch 0's stored order obeys the same count."""
        if positions == 0:
            return 0
        epoch_ends = -(-(positions - 1) // layout.num_records)
        blocks = -(-positions // self.block_size) + 2 * epoch_ends + 1
        return min(positions, extents_per_block(layout, self.block_size) * blocks)

    def describe(self) -> str:
        return f"block (blocks of {self.block_size} records)"


def extents_per_block(layout: ShardLayout, block_size: int) -> int:
    """The most extents (ranged reads of consecutive records of one shard) ``block_size`` consecutive
    records of ``layout``'s order (wrapping from the last record to the first) can take: one, plus the
    shard boundaries inside them."""
    n = layout.num_records
    length = min(block_size, n)
    counts = np.array(layout.record_counts, np.int64)
    # Where a read must break: every non-empty shard's first record, and record 0 (the wrap).
    starts = np.unique((np.cumsum(counts) - counts)[counts > 0] % n)
    if length <= 1:
        return 1
    # The window with the most breaks inside starts just before one of them: count the breaks in
    # [b, b + length - 2] for each break b, cyclically.
    doubled = np.concatenate((starts, starts + n))
    inside = np.searchsorted(doubled, starts + length - 1, side="left") - np.arange(len(starts))
    return 1 + int(inside.max())
