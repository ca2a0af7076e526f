"""The windowed epoch order (``windowed``): blocks of contiguous records, each dealt out over many steps.

The block order (``BlockPermutation``) keeps a later epoch's reads long, but a block's ``block_size``
records are read together into one batch every epoch: measured, 97% of the examples next to each other
in a batch of epoch 1 share a batch again in epoch 2 (0.8% under the per-record order). The windowed
order reads the same kind of blocks but deals each block's records out over ``block_size`` consecutive
steps, one per step, at the same place in the batch: a batch holds one record of each of ``width``
blocks, and records read together never share a batch.

An epoch of ``n`` records is laid out as a table ``width`` columns wide, filled row by row: position
``p`` is row ``q = p // width`` of column ``c = p % width``. Column ``c`` reads a stretch of the epoch's
block order (a ``BlockPermutation`` of its own key): its positions ``[s_c, s_c + m_c)``, where the first
``n mod width`` columns hold ``m_c = n // width + 1`` and the others ``n // width`` (``s_c`` the lengths
before ``c``). Row ``q`` of column ``c`` reads position ``s_c + ((q + t_c) mod m_c)`` of it, turned by
``t_c = (c - s_c) mod block_size`` so that column ``c`` starts a new block at the rows ``q`` where ``q +
c`` is a multiple of ``block_size``: at every row one column in ``block_size`` does, so a host's
requests come evenly, not all at one step. Both directions are O(1) (the inverse finds the column from
the stretch the block order's inverse lands in), and neither depends on anything but (seed, task,
epoch, n, block_size, width): not on hosts, steps or how far the run has gone.

With ``width`` the task's examples per global step (the global batch size of a run of one task), a row
is one step's batch and a column one place in it, which belongs to the same host at every step whatever
the number of hosts: a host reads each block its columns hold once, with one request when its client
knows the ``block_size`` steps ahead that the block spans (``WindowedOrder.read_horizon``), and keeps the
rest of it while its records are dealt out: ``block_size`` records per column at most. A task whose
share of a step is not ``width`` still gets a bijection and batches of records from different blocks,
with more requests per step. ``WindowedOrder.reads_bound`` and ``requests_bound`` state both bounds, ``records_held`` the memory;
``taskdata.index.read_bound`` sums them over a plan's tasks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from taskdata.index.layout import ShardLayout
from taskdata.index.orders.base import EpochOrder, check_index, check_key, check_option, check_size
from taskdata.index.orders.block import BlockOrder, BlockPermutation, extents_per_block
from taskdata.seeding import derive_seed

__all__ = ["WindowedOrder", "WindowedPermutation"]

# The order of each epoch's blocks, whose stretches the columns read.
_BLOCKS = BlockOrder(block_size=1)


@dataclasses.dataclass(frozen=True)
class WindowedPermutation:
    """A keyed permutation of ``[0, size)``: blocks of ``block_size`` contiguous values, each dealt out over
    ``block_size`` rows of a table ``width`` wide (see the module docstring)."""

    size: int
    block_size: int
    width: int
    key: int

    def __post_init__(self) -> None:
        for field, value in (("size", self.size), ("block_size", self.block_size), ("width", self.width)):
            check_size(value, f"A windowed permutation's {field}")
        check_key(self.key, "A windowed permutation key")

    @functools.cached_property
    def blocks(self) -> BlockPermutation:
        """The epoch's block order, whose stretches the columns read."""
        return BlockPermutation(size=self.size, block_size=self.block_size, key=self.key)

    def _column(self, column: int) -> tuple[int, int, int]:
        """Where column ``column``'s stretch starts in the block order, its length, and its turn."""
        rows, longer = divmod(self.size, self.width)
        start = column * rows + min(column, longer)
        return start, rows + (column < longer), (column - start) % self.block_size

    def __call__(self, index: int) -> int:
        check_index(index, self.size)
        row, column = divmod(index, self.width)
        start, length, turn = self._column(column)
        return self.blocks(start + (row + turn) % length)

    def inverse(self, value: int) -> int:
        check_index(value, self.size)
        stretch = self.blocks.inverse(value)
        rows, longer = divmod(self.size, self.width)
        split = longer * (rows + 1)  # the longer columns' stretches come first
        column = stretch // (rows + 1) if stretch < split else longer + (stretch - split) // rows
        start, length, turn = self._column(column)
        return ((stretch - start - turn) % length) * self.width + column


@dataclasses.dataclass(frozen=True)
class WindowedOrder(EpochOrder):
    """Each epoch >= 1 of a task reads blocks of ``block_size`` records, each dealt out one record a step at
    one place of a batch ``width`` wide (``WindowedPermutation``): read like the block order by a client that
    knows ``block_size`` steps ahead, with batches as mixed as the per-record order's."""

    kind: ClassVar[str] = "windowed"
    block_size: int
    width: int

    vectorised_below: ClassVar[int] = 2**62  # as the block order's

    def __post_init__(self) -> None:
        check_option(self.block_size, "A windowed epoch order needs a block size (records per block)",
                     "64 keeps a host of 256 examples at a handful of requests per step.")
        check_option(self.width, "A windowed epoch order needs a width (a task's examples per global step: the "
                     "global batch size of a run of one task)")

    def make_permutation(self, seed: int, task: str, epoch: int, size: int) -> WindowedPermutation:
        # Its own tag: its block order's keys are not the block order's ("block_order").
        key = derive_seed(seed, "windowed_order", task, epoch)
        return WindowedPermutation(size=size, block_size=self.block_size, width=self.width, key=key)

    def apply_vectorised(
        self, permutations: Sequence[WindowedPermutation], which: np.ndarray, indices: np.ndarray
    ) -> np.ndarray:
        """Each index's place in its block order, vectorised, then one ``BlockOrder.apply`` for all."""
        sizes = np.array([p.size for p in permutations], np.int64)[which]
        widths = np.array([p.width for p in permutations], np.int64)[which]
        block_sizes = np.array([p.block_size for p in permutations], np.int64)[which]
        rows, columns = np.divmod(indices, widths)
        full_rows, longer = np.divmod(sizes, widths)
        starts = columns * full_rows + np.minimum(columns, longer)
        lengths = full_rows + (columns < longer)
        turns = (columns - starts) % block_sizes
        return _BLOCKS.apply([p.blocks for p in permutations], which, starts + (rows + turns) % lengths)

    def reads_bound(self, layout: ShardLayout, positions: int) -> int:
        """One read per position: a step's instructions take one record of each of up to ``positions`` blocks
        (``requests_bound`` is what a client that reads ahead makes)."""
        return positions

    @property
    def read_horizon(self) -> int:
        return self.block_size

    def records_held(self, positions: int) -> int:
        """The rest of the block each of the host's columns is dealt from: ``block_size`` records each."""
        return positions * self.block_size

    def requests_bound(self, layout: ShardLayout, positions: int) -> int:
        """At each row one column in ``K`` starts a block and one in ``K`` wraps to the start of its stretch,
        so ``L`` consecutive positions of one row start at most ``2 * (ceil(L / K) + 1)`` blocks, each at most
        ``extents_per_block`` requests, when the task's examples per step are the order's ``width``; a
        client's first step starts every column."""
        if positions == 0:
            return 0
        blocks = 2 * (-(-positions // self.block_size) + 1)
        return min(positions, extents_per_block(layout, self.block_size) * blocks)

    def describe(self) -> str:
        return (
            f"windowed (blocks of {self.block_size} records, each dealt out over {self.block_size} steps of "
            f"{self.width} examples)"
        )
