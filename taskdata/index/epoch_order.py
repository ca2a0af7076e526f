"""How a run orders each task's records in epochs after the first: the plan's ``epoch_order`` option.

- ``feistel`` (what every plan without the option reads): each epoch is its own keyed per-record
  permutation (``EpochPermutation``). The most random order, but every example of a later epoch is
  its own ranged read: a host with 256 examples of a step makes 256 requests.
- ``block``: each epoch is a keyed shuffle of blocks of ``block_size`` contiguous records
  (``BlockPermutation``), so a host's reads per step stay bounded (``taskdata.index.read_bound``):
  256 examples in blocks of 64 are at most a handful of reads.
- ``windowed``: the same kind of blocks, each dealt out over ``block_size`` consecutive steps at one
  place of a batch ``width`` examples wide (``WindowedPermutation``), so that records read together
  never share a batch; a client that knows ``block_size`` steps ahead still reads each block once.

Epoch 0 reads the cache in stored order under each. All are pure O(1) functions of the position
with O(1) inverses, keyed by (seed, task, epoch) only. This module is the one place that picks the
one or the other; ``assign``, ``arrays`` and every inverse (``locate_example``) go through it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

from taskdata.index.block_order import BlockPermutation
from taskdata.index.errors import PlanError
from taskdata.index.permutation import (
    EpochPermutation,
    _epoch_permutation,
    check_epoch_and_index,
    epoch_and_index,
    task_position_of,
)
from taskdata.index.windowed_order import WindowedPermutation

__all__ = [
    "FEISTEL",
    "EpochOrder",
    "block_permutation",
    "epoch_and_index_in",
    "epoch_permutation",
    "task_position_in",
    "windowed_permutation",
]

_KINDS = ("feistel", "block", "windowed")


@dataclasses.dataclass(frozen=True)
class EpochOrder:
    """The order of epochs >= 1: ``EpochOrder()`` (per-record Feistel), ``EpochOrder.blocks(n)`` or
    ``EpochOrder.windowed(n, width)``."""

    kind: Literal["feistel", "block", "windowed"] = "feistel"
    block_size: int | None = None
    width: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise PlanError(f"Epoch order must be one of {list(_KINDS)} but got {self.kind!r}.")
        size = self.block_size
        if self.kind == "feistel" and size is not None:
            raise PlanError(
                f"The feistel epoch order has no block size but got block_size={size!r}. Use "
                "EpochOrder.blocks(size) for a block order."
            )
        if self.kind != "feistel" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise PlanError(
                f"A {self.kind} epoch order needs a block size (records per block) that is a positive integer but "
                f"got {size!r}. 64 keeps a host of 256 examples at a handful of reads per step."
            )
        width = self.width
        if self.kind != "windowed" and width is not None:
            raise PlanError(f"The {self.kind} epoch order has no width but got width={width!r}. Use "
                            "EpochOrder.windowed(block_size, width) for a windowed order.")
        if self.kind == "windowed" and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
            raise PlanError(
                f"A windowed epoch order needs a width (a task's examples per global step: the global batch size "
                f"of a run of one task) that is a positive integer but got {width!r}."
            )

    @classmethod
    def blocks(cls, block_size: int) -> EpochOrder:
        return cls("block", block_size)

    @classmethod
    def windowed(cls, block_size: int, width: int) -> EpochOrder:
        return cls("windowed", block_size, width)

    @property
    def read_horizon(self) -> int:
        """Steps a client must know ahead to read each block with one request (0: none beyond the step)."""
        return (self.block_size or 0) if self.kind == "windowed" else 0

    def records_held(self, positions: int) -> int:
        """The most records a host reading ``positions`` positions per step holds to read them with the
        requests ``taskdata.index.read_bound`` counts: its step's own, or under the windowed order the rest of
        the block each of its columns is dealt from (``block_size`` records each)."""
        return positions * (self.block_size or 1) if self.kind == "windowed" else positions

    @property
    def is_default(self) -> bool:
        """Whether this is the order of plans that do not name one (their JSON and fingerprint omit it)."""
        return self.kind == "feistel"

    def to_dict(self) -> dict[str, Any]:
        # Only the windowed order writes a width: the other orders' plans keep the JSON (and fingerprint) they had.
        width = {"width": self.width} if self.kind == "windowed" else {}
        return {"kind": self.kind, "block_size": self.block_size, **width}

    @classmethod
    def from_dict(cls, data: Any) -> EpochOrder:
        if not isinstance(data, dict) or set(data) - {"width"} != {"kind", "block_size"}:
            raise PlanError(
                f"A plan's epoch_order must be an object with keys 'kind', 'block_size' (and 'width' for the "
                f"windowed order) but got {data!r}."
            )
        return cls(data["kind"], data["block_size"], data.get("width"))

    def describe(self) -> str:
        if self.kind == "feistel":
            return "feistel (per record)"
        if self.kind == "block":
            return f"block (blocks of {self.block_size} records)"
        return (f"windowed (blocks of {self.block_size} records, each dealt out over {self.block_size} steps of "
                f"{self.width} examples)")


FEISTEL = EpochOrder()


def epoch_and_index_in(
    order: EpochOrder, seed: int, task: str, num_records: int, task_position: int
) -> tuple[int, int]:
    """Position in ``task``'s stream -> (epoch, record index in the task's global order), under ``order``."""
    if order.kind == "feistel":
        return epoch_and_index(seed, task, num_records, task_position)
    if isinstance(task_position, bool) or not isinstance(task_position, int) or task_position < 0:
        raise PlanError(f"A task position must be an integer >= 0 but got {task_position!r}.")
    epoch, offset = divmod(task_position, num_records)
    if epoch == 0:
        return 0, offset
    return epoch, epoch_permutation(order, seed, task, epoch, num_records)(offset)


def task_position_in(order: EpochOrder, seed: int, task: str, num_records: int, epoch: int, index: int) -> int:
    """The inverse of ``epoch_and_index_in``: where in ``task``'s stream (epoch, index) is read."""
    if order.kind == "feistel":
        return task_position_of(seed, task, num_records, epoch, index)
    check_epoch_and_index(epoch, index, num_records)
    if epoch == 0:
        return index
    return epoch * num_records + epoch_permutation(order, seed, task, epoch, num_records).inverse(index)


def epoch_permutation(
    order: EpochOrder, seed: int, task: str, epoch: int, size: int
) -> EpochPermutation | BlockPermutation | WindowedPermutation:
    """The permutation of ``task``'s ``size`` records in ``epoch`` (>= 1) under ``order``."""
    if order.kind == "feistel":
        return _epoch_permutation(seed, task, epoch, size)
    assert order.block_size is not None
    if order.kind == "windowed":
        assert order.width is not None
        return windowed_permutation(seed, task, epoch, size, order.block_size, order.width)
    return block_permutation(seed, task, epoch, size, order.block_size)


# As for the per-record order: a batch touches few (task, epoch) pairs; remember recent ones.
@functools.lru_cache(maxsize=4096)
def block_permutation(seed: int, task: str, epoch: int, size: int, block_size: int) -> BlockPermutation:
    return BlockPermutation.for_epoch(seed, task, epoch, size, block_size)


@functools.lru_cache(maxsize=4096)
def windowed_permutation(seed: int, task: str, epoch: int, size: int, block_size: int, width: int) -> WindowedPermutation:
    return WindowedPermutation.for_epoch(seed, task, epoch, size, block_size, width)
