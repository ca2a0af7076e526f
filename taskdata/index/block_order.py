"""Block order of an epoch: a keyed shuffle of fixed-size blocks of contiguous records.

The per-record order (``EpochPermutation``) makes every example of a later epoch its own ranged read.
The block order keeps reads long: an epoch of ``n`` records is read as blocks of ``block_size``
records that are contiguous in the cache, in a keyed pseudo-random order of blocks.

One epoch's order, for position ``i`` in ``[0, n)`` of the epoch:

1. rotate: the cache's order is read from a keyed offset ``o`` in ``[0, n)`` on, wrapping around
   (record ``(j + o) mod n`` is the epoch's ``j``-th in rotated order), so that the records that share a
   block change from epoch to epoch instead of being the same ``block_size`` records every epoch;
2. cut the rotated order into ``F = n // block_size`` full blocks and, when ``block_size`` does not
   divide ``n``, one partial block of ``n mod block_size`` records at the end;
3. read the full blocks in the order of a keyed ``EpochPermutation`` of ``[0, F)`` and the partial
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
blocks, and each block is at most a few ranged reads (one more per cache-shard boundary inside it):
``taskdata.index.read_bound`` states the bound a plan gives.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from taskdata.index.errors import PlanError
from taskdata.index.permutation import EpochPermutation, check_many, permute_many
from taskdata.seeding import check_seed, derive_seed

__all__ = ["BlockPermutation", "block_permute_many"]

_M64 = (1 << 64) - 1
# Tells the rotation's value apart from the block permutation's key (both come from one derived key).
_OFFSET_TWEAK = 0x6A09E667F3BCC909


def _mix64(x: int) -> int:
    """splitmix64's finalizer (as in ``permutation``): every output bit depends on every input bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@dataclasses.dataclass(frozen=True)
class BlockPermutation:
    """A keyed permutation of ``[0, size)`` that moves blocks of ``block_size`` contiguous values."""

    size: int
    block_size: int
    key: int

    def __post_init__(self) -> None:
        for field, value in (("size", self.size), ("block_size", self.block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"A block permutation's {field} must be a positive integer but got {value!r}.")
        if isinstance(self.key, bool) or not isinstance(self.key, int) or not 0 <= self.key <= _M64:
            raise PlanError(f"A block permutation key must be an integer in [0, 2**64) but got {self.key!r}.")

    @classmethod
    def for_epoch(cls, seed: int, task: str, epoch: int, size: int, block_size: int) -> BlockPermutation:
        """The block order of ``task``'s records in ``epoch`` (>= 1) of a run with ``seed``."""
        check_seed(seed)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
            raise PlanError(
                f"Only epochs >= 1 are permuted (epoch 0 is stored order) but got epoch {epoch!r}."
            )
        # Its own tag: the block order's keys are not the per-record order's ("epoch_order").
        return cls(size=size, block_size=block_size, key=derive_seed(seed, "block_order", task, epoch))

    @property
    def full_blocks(self) -> int:
        return self.size // self.block_size

    @functools.cached_property
    def offset(self) -> int:
        """Where in the cache's order the epoch's rotated order starts."""
        return _mix64(self.key ^ _OFFSET_TWEAK) % self.size

    @functools.cached_property
    def blocks(self) -> EpochPermutation:
        """The order of the full blocks (of one block when there are none, never used then)."""
        return EpochPermutation(size=max(1, self.full_blocks), key=self.key)

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
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.size:
            raise PlanError(f"Index must be an integer in [0, {self.size}) but got {index!r}.")


def block_permute_many(
    permutations: Sequence[BlockPermutation], which: np.ndarray, indices: np.ndarray
) -> np.ndarray:
    """``permutations[which[j]](indices[j])`` for every ``j``, vectorised: an int64 array.

    The blocks of all permutations go through one ``permute_many`` call; sizes must stay below 2**62
    (call the permutation itself beyond that: it is exact for any size).
    """
    which, indices = check_many("block_permute_many", len(permutations), which, indices)
    if not indices.size:
        return np.empty(0, np.int64)
    largest = max(p.size for p in permutations)
    if largest >= 2**62:
        pairs = zip(which.tolist(), indices.tolist(), strict=True)
        return np.array([permutations[w](i) for w, i in pairs], np.int64)
    sizes = np.array([p.size for p in permutations], np.int64)[which]
    outside = (indices < 0) | (indices >= sizes)
    if outside.any():
        bad = int(np.flatnonzero(outside)[0])
        permutations[which[bad]]._check(int(indices[bad]))  # raises the scalar path's message
    block_sizes = np.array([p.block_size for p in permutations], np.int64)[which]
    full = np.array([p.full_blocks for p in permutations], np.int64)[which]
    offsets = np.array([p.offset for p in permutations], np.int64)[which]
    slots, within = np.divmod(indices, block_sizes)
    blocks = slots.copy()
    moved = np.flatnonzero(slots < full)
    if moved.size:
        blocks[moved] = permute_many([p.blocks for p in permutations], which[moved], slots[moved])
    # (rotated + offset) mod size without forming a sum beyond int64: both terms are below size.
    values = blocks * block_sizes + within - (sizes - offsets)
    values[values < 0] += sizes[values < 0]
    return values
