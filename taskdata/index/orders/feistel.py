"""The per-record epoch order (``feistel``, what every plan without an ``epoch_order`` reads): each epoch
is its own keyed permutation of the task's records. The most random order, but every example of a later
epoch is its own ranged read: a host with 256 examples of a step makes 256 requests.

The order of an epoch is a Feistel network over ``[0, 2**b)`` (the smallest power of two covering
the task's ``n`` records), made into a permutation of ``[0, n)`` by cycle walking: apply the network
again until the value falls below ``n``. A permutation of a larger set, restricted this way, is a
permutation of the smaller one; since ``2**b < 2 * n`` the walk applies the network fewer than
twice on average. When ``b`` is odd the two halves differ by one bit and trade places every round (an
alternating, unbalanced Feistel network); every round stays invertible. The round function is
SplitMix64's finalizer (``taskdata.splitmix64``). Every lookup is O(1) expected, with no table: a task
with 10**10 records costs the same as one with 10.

``FeistelOrder.apply`` applies many permutations to many indices at once with numpy (uint64 arithmetic
wraps exactly like the ``& _M64`` of the scalar code); the scalar methods stay the reference.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from taskdata.index.layout import ShardLayout
from taskdata.index.orders.base import EpochOrder, check_index, check_key, check_size
from taskdata.seeding import derive_seed
from taskdata.splitmix64 import GAMMA, MUL1, MUL2, mix64

__all__ = ["FeistelOrder", "FeistelPermutation"]

_M64 = (1 << 64) - 1
# Six rounds: Luby-Rackoff needs four rounds of a good round function for a pseudo-random
# permutation; two more cost little and leave margin for the simple (non-cryptographic) mixer.
_ROUNDS = 6
# A vector pass costs about as much as 16 scalar encryptions (``_walk``), whatever its length: the
# last few indices that still walk are finished one at a time.
_SCALAR_TAIL = 16
# Sizes up to 2**60 split into halves of at most 30 bits (see _encrypt_many).
_VECTOR_BITS = 60
# Permutations whose halves have at most this many bits (sizes up to 2**24) are applied with a lookup table
# per round (``_round_tables``: 6 x 2**12 int64 at most, 192 KiB), kept for the most recently used ones.
_TABLE_BITS = 12
_TABLES_KEPT = 64
# Several permutations' tables side by side (``_side_by_side``), up to this many entries per round (6 x 2**14
# int64: 768 KiB), kept for the most recent tuples of permutations.
_SIDE_BY_SIDE = 2**14
_SIDE_BY_SIDE_KEPT = 16


@dataclasses.dataclass(frozen=True)
class FeistelPermutation:
    """A keyed permutation of ``[0, size)``: ``perm(i)`` and its inverse ``perm.inverse(j)`` in O(1)."""

    size: int
    key: int
    _bits: int = dataclasses.field(init=False, repr=False, compare=False)
    # Per round: (key, low bits split off, mask of the other part).
    _rounds: tuple[tuple[int, int, int], ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_size(self.size, "A permutation size")
        check_key(self.key, "A permutation key")
        bits = (self.size - 1).bit_length()
        rounds = []
        for r in range(_ROUNDS):
            low = (bits + 1) // 2 if r % 2 == 0 else bits // 2
            rounds.append((mix64((self.key + (r + 1) * GAMMA) & _M64), low, (1 << (bits - low)) - 1))
        object.__setattr__(self, "_bits", bits)
        object.__setattr__(self, "_rounds", tuple(rounds))

    def __call__(self, index: int) -> int:
        self._check(index)
        if self.size == 1:
            return 0
        value = self._encrypt(index)
        while value >= self.size:
            value = self._encrypt(value)
        return value

    def inverse(self, value: int) -> int:
        self._check(value)
        if self.size == 1:
            return 0
        index = self._decrypt(value)
        while index >= self.size:
            index = self._decrypt(index)
        return index

    @functools.cached_property
    def _halves(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        """The rounds as swaps of two halves (see ``_encrypt_many``): where the first round splits (its
        low bits), and per round the key folded with its own ``>> 30`` and the mask of the half it writes."""
        return (self._bits + 1) // 2, tuple((key ^ (key >> 30), mask) for key, _, mask in self._rounds)

    @functools.cached_property
    def _vector_params(self) -> np.ndarray:
        """``_halves`` as one uint64 column: the round keys, the round masks, the split and its mask, and
        the mixer's constants (see ``_encrypt_many``)."""
        split, rounds = self._halves
        keys, masks = zip(*rounds, strict=True)
        return np.array([*keys, *masks, split, (1 << split) - 1, MUL1, MUL2, 27, 31], dtype=np.uint64)

    def _walk(self, value: int) -> int:
        """Cycle walking from an encryption that fell outside the range, on Python ints: ``_encrypt``
        computed as ``_encrypt_many`` does, which takes about two thirds of the time."""
        split, rounds = self._halves
        size, split_mask = self.size, (1 << split) - 1
        while value >= size:
            high, low = value >> split, value & split_mask
            for key, mask in rounds:
                t = ((low ^ key) * MUL1) & _M64
                t ^= t >> 27
                t = (t * MUL2) & _M64
                high ^= (t ^ (t >> 31)) & mask
                high, low = low, high
            value = (high << split) | low
        return value

    def _check(self, index: int) -> None:
        check_index(index, self.size)

    def _encrypt(self, x: int) -> int:
        bits = self._bits
        for key, low, mask in self._rounds:
            # (high, low) -> (low, high ^ F(low)): the low part moves up, the high part is masked.
            right = x & ((1 << low) - 1)
            x = (right << (bits - low)) | ((x >> low) ^ (mix64(right ^ key) & mask))
        return x

    def _decrypt(self, x: int) -> int:
        bits = self._bits
        for key, low, mask in reversed(self._rounds):
            right = x >> (bits - low)
            x = (((x & mask) ^ (mix64(right ^ key) & mask)) << low) | right
        return x


@dataclasses.dataclass(frozen=True)
class FeistelOrder(EpochOrder):
    """Each epoch >= 1 of a task is its own keyed ``FeistelPermutation`` of the task's records."""

    kind: ClassVar[str] = "feistel"

    def make_permutation(self, seed: int, task: str, epoch: int, size: int) -> FeistelPermutation:
        # The "epoch_order" tag keeps these keys apart from any other use of (seed, task, int).
        return FeistelPermutation(size=size, key=derive_seed(seed, "epoch_order", task, epoch))

    def apply_vectorised(
        self, permutations: Sequence[FeistelPermutation], which: np.ndarray, indices: np.ndarray
    ) -> np.ndarray:
        """Where every permutation's halves have at most ``_TABLE_BITS`` bits (sizes up to 2**24) and their
        tables side by side stay small, a round is one lookup in a table of its round function
        (``_round_tables``) instead of the mixer's nine numpy calls (``_mixer_many``)."""
        bits = max(p._bits for p in permutations)
        width = 1 << (bits + 1) // 2
        if bits > 2 * _TABLE_BITS or len(permutations) * width > _SIDE_BY_SIDE:
            return _mixer_many(permutations, which, indices)
        return _table_many(permutations, which, indices, width)

    def reads_bound(self, layout: ShardLayout, positions: int) -> int:
        return positions  # every example of a later epoch may be its own read

    def describe(self) -> str:
        return "feistel (per record)"


def _mixer_many(permutations: Sequence[FeistelPermutation], which: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``FeistelOrder.apply`` with the mixer computed in numpy: one pass encrypts every index; each further
    pass re-encrypts only the values still outside their permutation's range (cycle walking), until few
    are left to finish one at a time."""
    if max(p.size for p in permutations) > 2**_VECTOR_BITS:
        # The vector rounds rely on halves of at most 30 bits; beyond 2**60 records, go one by one.
        pairs = zip(which.tolist(), indices.tolist(), strict=True)
        return np.array([permutations[w](i) for w, i in pairs], np.int64)
    sizes = np.array([p.size for p in permutations], np.int64)[which]
    table = np.array([p._vector_params for p in permutations]).T
    values = _encrypt_many(indices.astype(np.uint64), table.take(which, axis=1))
    walking = np.flatnonzero(values >= sizes)
    while walking.size > _SCALAR_TAIL:
        again = _encrypt_many(values[walking], table.take(which[walking], axis=1))
        values[walking] = again
        walking = walking[again >= sizes[walking]]
    for j in walking.tolist():
        values[j] = permutations[which[j]]._walk(int(values[j]))
    return values.astype(np.int64)


def _table_many(
    permutations: Sequence[FeistelPermutation], which: np.ndarray, indices: np.ndarray, width: int
) -> np.ndarray:
    """``FeistelOrder.apply`` with each round one lookup in the permutations' round tables, ``width``
    entries wide (the widest half's)."""
    split: np.ndarray | int
    mask: np.ndarray | int
    tag: np.ndarray | None
    if len(permutations) == 1:
        # One table, one split: plain scalars.
        (permutation,) = permutations
        table, tag = _round_tables(permutation), None
        split = (permutation._bits + 1) // 2
        mask = (1 << split) - 1
    else:
        table, splits, masks, tags = _side_by_side(tuple(permutations))
        split, mask, tag = splits[which], masks[which], tags[which]
    values = _encrypt_tables(indices, table, split, mask, tag, width - 1)
    if all(p.size == 1 << p._bits for p in permutations):
        return values  # a power of two: every value is in range at once
    sizes = np.array([p.size for p in permutations], np.int64)[which]
    walking = np.flatnonzero(values >= sizes)
    while walking.size > _SCALAR_TAIL:
        again = _encrypt_tables(
            values[walking],
            table,
            split if isinstance(split, int) else split[walking],
            mask if isinstance(mask, int) else mask[walking],
            None if tag is None else tag[walking],
            width - 1,
        )
        values[walking] = again
        walking = walking[again >= sizes[walking]]
    for j in walking.tolist():
        values[j] = permutations[which[j]]._walk(int(values[j]))
    return values


@functools.lru_cache(maxsize=_SIDE_BY_SIDE_KEPT)
def _side_by_side(permutations: tuple[FeistelPermutation, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The round tables of ``permutations`` side by side, permutation ``b``'s from column ``b * width`` on
    (``width``: the widest table's), with each one's split, its mask and its tag ``b * width``.

    A value's halves carry their permutation's tag above their own bits: a lookup at a tagged half reads that
    permutation's table, and XOR with a round's output (below ``width``) leaves the tag, so a round is one
    lookup and one XOR for every permutation at once. Kept per tuple: a step's tasks and epochs repeat for
    many steps.
    """
    tables = [_round_tables(p) for p in permutations]
    width = max(t.shape[1] for t in tables)
    table = np.zeros((_ROUNDS, len(tables) * width), np.int64)
    for b, own in enumerate(tables):
        table[:, b * width : b * width + own.shape[1]] = own
    splits = np.array([(p._bits + 1) // 2 for p in permutations], np.int64)
    out = (table, splits, (1 << splits) - 1, np.arange(len(tables), dtype=np.int64) * width)
    for array in out:
        array.flags.writeable = False
    return out


@functools.lru_cache(maxsize=_TABLES_KEPT)
def _round_tables(permutation: FeistelPermutation) -> np.ndarray:
    """Row ``r``: the round function of round ``r`` (``_encrypt_many``'s, masked) at every value below
    ``2**split``, the wider half's size (odd rounds read the other half, which may be one bit narrower: their
    last entries are never read). All rounds at once, as ``_encrypt_many`` computes one: a permutation is
    made whenever a task enters an epoch, every few steps for a small task."""
    split, rounds = permutation._halves
    keys, masks = (np.array(column, np.uint64)[:, None] for column in zip(*rounds, strict=True))
    t = np.arange(1 << split, dtype=np.uint64) ^ keys
    t *= np.uint64(MUL1)
    t ^= t >> np.uint64(27)
    t *= np.uint64(MUL2)
    t ^= t >> np.uint64(31)
    t &= masks
    out = t.astype(np.int64)
    out.flags.writeable = False
    return out


def _encrypt_tables(
    values: np.ndarray,
    tables: np.ndarray,
    split: np.ndarray | int,
    mask: np.ndarray | int,
    tag: np.ndarray | None,
    tag_mask: int,
) -> np.ndarray:
    """``_encrypt_many`` with each round's function looked up in ``tables`` (rows: rounds) at its half, which
    carries ``tag`` above its bits where given (``_side_by_side``; ``tag_mask`` clears it at the end)."""
    high = values >> split
    low = values & mask
    if tag is not None:
        high |= tag
        low |= tag
    looked = np.empty_like(values)
    for row in tables:
        row.take(low, out=looked)
        high ^= looked
        high, low = low, high
    if tag is not None:
        high &= tag_mask
        low &= tag_mask
    high <<= split
    high |= low
    return high


def _encrypt_many(values: np.ndarray, params: np.ndarray) -> np.ndarray:
    """``FeistelPermutation._encrypt`` of each value, with its own ``_vector_params`` (a column of ``params``,
    which is C-contiguous, so that every row is).

    The split sizes alternate (``low`` bits, then ``bits - low``), so the part a round moves up is
    exactly the part the next round splits off: the rounds become the textbook swap of two halves,
    ``(high, low) -> (low, high ^ F(low))``, with no shifting in between. And since a half has at most
    30 bits, the mixer's first step ``t ^= t >> 30`` on ``t = low ^ key`` only sees the key's bits:
    ``low ^ key ^ (key >> 30)``, one XOR with a precomputed key.
    """
    keys, masks = params[:_ROUNDS], params[_ROUNDS : 2 * _ROUNDS]
    # The mixer's constants come as rows too: a ufunc call with a scalar operand costs half as much again.
    split, split_mask, c1, c2, s27, s31 = params[2 * _ROUNDS :]
    high = values >> split
    low = values & split_mask
    t = np.empty_like(values)
    shifted = np.empty_like(values)
    for key, mask in zip(keys, masks, strict=True):
        np.bitwise_xor(low, key, t)
        t *= c1
        np.right_shift(t, s27, shifted)
        t ^= shifted
        t *= c2
        np.right_shift(t, s31, shifted)
        t ^= shifted
        t &= mask
        high ^= t
        high, low = low, high
    high <<= split
    high |= low
    return high
