"""Windowed block order of an epoch: blocks of contiguous records, each dealt out over many steps.

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
knows the ``block_size`` steps ahead that the block spans (``EpochOrder.read_horizon``), and keeps the
rest of it while its records are dealt out: ``block_size`` records per column at most. A task whose
share of a step is not ``width`` still gets a bijection and batches of records from different blocks,
with more requests per step. ``taskdata.index.read_bound`` states both bounds.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from taskdata.index.block_order import BlockPermutation, block_permute_many
from taskdata.index.errors import PlanError
from taskdata.index.permutation import check_many
from taskdata.seeding import check_seed, derive_seed

__all__ = ["WindowedPermutation", "windowed_permute_many"]


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
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"A windowed permutation's {field} must be a positive integer but got {value!r}.")

    @classmethod
    def for_epoch(cls, seed: int, task: str, epoch: int, size: int, block_size: int, width: int) -> WindowedPermutation:
        """The windowed order of ``task``'s records in ``epoch`` (>= 1) of a run with ``seed``."""
        check_seed(seed)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
            raise PlanError(f"Only epochs >= 1 are permuted (epoch 0 is stored order) but got epoch {epoch!r}.")
        # Its own tag: its block order's keys are not the block order's ("block_order").
        key = derive_seed(seed, "windowed_order", task, epoch)
        return cls(size=size, block_size=block_size, width=width, key=key)

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
        self._check(index)
        row, column = divmod(index, self.width)
        start, length, turn = self._column(column)
        return self.blocks(start + (row + turn) % length)

    def inverse(self, value: int) -> int:
        self._check(value)
        stretch = self.blocks.inverse(value)
        rows, longer = divmod(self.size, self.width)
        split = longer * (rows + 1)  # the longer columns' stretches come first
        column = stretch // (rows + 1) if stretch < split else longer + (stretch - split) // rows
        start, length, turn = self._column(column)
        return ((stretch - start - turn) % length) * self.width + column

    def _check(self, index: int) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.size:
            raise PlanError(f"Index must be an integer in [0, {self.size}) but got {index!r}.")


def windowed_permute_many(
    permutations: Sequence[WindowedPermutation], which: np.ndarray, indices: np.ndarray
) -> np.ndarray:
    """``permutations[which[j]](indices[j])`` for every ``j``, vectorised: an int64 array (sizes below 2**62;
    call the permutation itself beyond that)."""
    which, indices = check_many("windowed_permute_many", len(permutations), which, indices)
    if not indices.size:
        return np.empty(0, np.int64)
    sizes = np.array([p.size for p in permutations], np.int64)[which]
    outside = (indices < 0) | (indices >= sizes)
    if outside.any():
        bad = int(np.flatnonzero(outside)[0])
        permutations[which[bad]]._check(int(indices[bad]))  # raises the scalar path's message
    if max(p.size for p in permutations) >= 2**62:
        pairs = zip(which.tolist(), indices.tolist(), strict=True)
        return np.array([permutations[w](i) for w, i in pairs], np.int64)
    widths = np.array([p.width for p in permutations], np.int64)[which]
    block_sizes = np.array([p.block_size for p in permutations], np.int64)[which]
    rows, columns = np.divmod(indices, widths)
    full_rows, longer = np.divmod(sizes, widths)
    starts = columns * full_rows + np.minimum(columns, longer)
    lengths = full_rows + (columns < longer)
    turns = (columns - starts) % block_sizes
    return block_permute_many([p.blocks for p in permutations], which, starts + (rows + turns) % lengths)
