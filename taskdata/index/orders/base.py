"""What every epoch order is: the interface the index chain calls, and what it does the same for all.

An epoch order says in which order a task's records are read in each epoch after the first (epoch 0
reads the cache's own order, already a keyed global shuffle). An order is a frozen dataclass whose
fields are its options; for each (seed, task, epoch) it makes an ``EpochPermutation`` of the task's
``n`` records: position ``i`` of the epoch reads record ``perm(i)``, and ``perm.inverse`` goes back,
both O(1) and keyed by (seed, task, epoch) only, so nothing depends on hosts, steps or how far the run
has gone. Besides that, an order computes many lookups at once (``apply``, numpy) and states how many
ranged reads a stretch of a task's stream can need (``reads_bound``).

A new order is a frozen dataclass subclass in a module of its own, implementing ``make_permutation``,
``apply_vectorised``, ``reads_bound`` and ``describe`` (and ``read_horizon``, ``records_held`` and ``requests_bound``
where a client that reads ahead makes fewer requests than the step's reads), and registered in ``taskdata.index.orders.ORDERS``: the chain,
the plan's JSON and ``taskdata plan --epoch-order`` find it there.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from taskdata.index.errors import PlanError
from taskdata.index.layout import ShardLayout

__all__ = ["EpochOrder", "EpochPermutation", "check_index", "check_key", "check_option", "check_size"]


class EpochPermutation(Protocol):
    """One epoch's order of a task's ``size`` records: a bijection of ``[0, size)`` and its inverse."""

    @property
    def size(self) -> int: ...

    def __call__(self, index: int) -> int: ...

    def inverse(self, value: int) -> int: ...


class EpochOrder(abc.ABC):
    """The order of a task's records in epochs >= 1; subclasses are frozen dataclasses of their options.

    ``kind`` names the order in a plan's JSON (``{"kind": ..., **options}``) and on the command line.
    """

    kind: ClassVar[str]

    @abc.abstractmethod
    def make_permutation(self, seed: int, task: str, epoch: int, size: int) -> EpochPermutation:
        """The order of ``task``'s ``size`` records in ``epoch`` (>= 1) of a run with ``seed``, keyed by
        ``taskdata.seeding.derive_seed`` with a tag of the order's own."""

    # Permutations of this size or more are applied one by one, in Python's exact integers: an order whose
    # vectorised int64 math would overflow for them says so here.
    vectorised_below: ClassVar[int] = 2**64

    def apply(self, permutations: Sequence[Any], which: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """``permutations[which[j]](indices[j])`` for every ``j``, as an int64 array: made by this order,
        sizes below 2**63, and indices in range, none of which is checked (``permute_many`` checks). The
        index chain calls this; its indices are in range by construction."""
        if not indices.size:
            return np.empty(0, np.int64)
        if max(p.size for p in permutations) >= self.vectorised_below:
            pairs = zip(which.tolist(), indices.tolist(), strict=True)
            return np.array([permutations[w](i) for w, i in pairs], np.int64)
        return self.apply_vectorised(permutations, which, indices)

    @abc.abstractmethod
    def apply_vectorised(self, permutations: Sequence[Any], which: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """``apply`` in numpy, for at least one index and sizes below ``vectorised_below``."""

    @abc.abstractmethod
    def reads_bound(self, layout: ShardLayout, positions: int) -> int:
        """The most ranged reads ``positions`` consecutive positions of a task's stream can need, in any
        epochs (epoch 0's stored order included), for a task whose cache is laid out as ``layout``."""

    @abc.abstractmethod
    def describe(self) -> str:
        """A few words for people: the kind and its options."""

    @property
    def read_horizon(self) -> int:
        """Steps a client must know ahead to make the requests ``requests_bound`` counts (0: only its step's)."""
        return 0

    def records_held(self, positions: int) -> int:
        """The most records a client reading ``positions`` positions of a task per step holds to read them
        with the requests ``requests_bound`` counts: by default its step's own."""
        return positions

    def requests_bound(self, layout: ShardLayout, positions: int) -> int:
        """The most requests per step (past a client's first) for ``positions`` consecutive positions of a
        task, for a client that knows ``read_horizon`` steps ahead and keeps what it read: by default
        ``reads_bound``."""
        return self.reads_bound(layout, positions)

    def permutation(self, seed: int, task: str, epoch: int, size: int) -> EpochPermutation:
        """``make_permutation``, checked, and kept for the most recent (seed, task, epoch, size)."""
        return self._permutations(seed, task, epoch, size)

    @functools.cached_property
    def _permutations(self) -> Callable[[int, str, int, int], EpochPermutation]:
        """This order's ``permutation``, remembered: a batch touches few (task, epoch) pairs, and deriving a
        key costs a keyed hash. One cache per order object, keyed without the order (hashing a dataclass
        costs a Python call)."""

        @functools.lru_cache(maxsize=4096)
        def permutation(seed: int, task: str, epoch: int, size: int) -> EpochPermutation:
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
                raise PlanError(f"Only epochs >= 1 are permuted (epoch 0 is stored order) but got epoch {epoch!r}.")
            return self.make_permutation(seed, task, epoch, size)

        return permutation

    def epoch_and_index(self, seed: int, task: str, num_records: int, task_position: int) -> tuple[int, int]:
        """Position in ``task``'s stream -> (epoch, record index in the task's cache order)."""
        if isinstance(task_position, bool) or not isinstance(task_position, int) or task_position < 0:
            raise PlanError(f"A task position must be an integer >= 0 but got {task_position!r}.")
        epoch, offset = divmod(task_position, num_records)
        if epoch == 0:
            return 0, offset
        return epoch, self.permutation(seed, task, epoch, num_records)(offset)

    def task_position(self, seed: int, task: str, num_records: int, epoch: int, index: int) -> int:
        """The inverse of ``epoch_and_index``: where in ``task``'s stream (epoch, index) is read."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise PlanError(f"An epoch must be an integer >= 0 but got {epoch!r}.")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < num_records:
            raise PlanError(f"Record index must be an integer in [0, {num_records}) but got {index!r}.")
        if epoch == 0:
            return index
        return epoch * num_records + self.permutation(seed, task, epoch, num_records).inverse(index)

    def permute_many(self, permutations: Sequence[Any], which: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """``apply``, with its input checked: two 1-D arrays of one length, every entry of ``which`` naming
        one of ``permutations`` and every index in its permutation's range."""
        which = np.asarray(which, dtype=np.int64)
        indices = np.asarray(indices, dtype=np.int64)
        if which.shape != indices.shape or which.ndim != 1:
            raise PlanError(
                f"permute_many needs two 1-D arrays of one length but got shapes {which.shape} and {indices.shape}."
            )
        if not indices.size:
            return np.empty(0, np.int64)
        if which.min() < 0 or which.max() >= len(permutations):
            raise PlanError(
                f"permute_many: every entry of which must be in [0, {len(permutations)}) (one per permutation) but "
                f"got values from {which.min()} to {which.max()}."
            )
        largest = max(p.size for p in permutations)
        if largest > 2**63:
            raise PlanError(
                f"permute_many works on int64 arrays, so permutations of at most 2**63 elements, but got one of "
                f"{largest}. Call the permutation itself: it is exact for any size."
            )
        last = np.array([p.size - 1 for p in permutations], np.int64)[which]  # a size of 2**63 is not an int64
        outside = (indices < 0) | (indices > last)
        if outside.any():
            bad = int(np.flatnonzero(outside)[0])
            permutations[which[bad]](int(indices[bad]))  # raises the permutation's own message
        return self.apply(permutations, which, indices)

    def to_dict(self) -> dict[str, Any]:
        """The plan's JSON of this order: its kind and its options."""
        assert dataclasses.is_dataclass(self)
        return {"kind": self.kind, **dataclasses.asdict(self)}


def check_option(value: object, needs: str, hint: str = "") -> None:
    """An order's option that must be a positive integer; ``needs`` says what it is, ``hint`` what to choose."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{needs} that is a positive integer but got {value!r}." + (f" {hint}" if hint else ""))


def check_size(value: object, what: str) -> None:
    """A permutation's size (or other count) that must be a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{what} must be a positive integer but got {value!r}.")


def check_key(value: object, what: str) -> None:
    """A permutation's 64-bit key."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise PlanError(f"{what} must be an integer in [0, 2**64) but got {value!r}.")


def check_index(index: object, size: int) -> None:
    """An index into a permutation of ``[0, size)``."""
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < size:
        raise PlanError(f"Index must be an integer in [0, {size}) but got {index!r}.")
