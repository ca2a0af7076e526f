"""How a run orders each task's records in epochs after the first: the plan's ``epoch_order`` option.

- ``feistel`` (what every plan without the option reads): each epoch is its own keyed per-record
  permutation (``EpochPermutation``). The most random order, but every example of a later epoch is
  its own ranged read: a host with 256 examples of a step makes 256 requests.
- ``block``: each epoch is a keyed shuffle of blocks of ``block_size`` contiguous records
  (``BlockPermutation``), so a host's reads per step stay bounded (``taskdata.index.read_bound``):
  256 examples in blocks of 64 are at most a handful of reads.

Epoch 0 reads the cache in stored order under either. Both are pure O(1) functions of the position
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

__all__ = [
    "FEISTEL",
    "EpochOrder",
    "block_permutation",
    "epoch_and_index_in",
    "epoch_permutation",
    "task_position_in",
]

_KINDS = ("feistel", "block")


@dataclasses.dataclass(frozen=True)
class EpochOrder:
    """The order of epochs >= 1: ``EpochOrder()`` (per-record Feistel) or ``EpochOrder.blocks(n)``."""

    kind: Literal["feistel", "block"] = "feistel"
    block_size: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise PlanError(f"Epoch order must be one of {list(_KINDS)} but got {self.kind!r}.")
        size = self.block_size
        if self.kind == "feistel" and size is not None:
            raise PlanError(
                f"The feistel epoch order has no block size but got block_size={size!r}. Use "
                "EpochOrder.blocks(size) for a block order."
            )
        if self.kind == "block" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise PlanError(
                f"A block epoch order needs a block size (records per block) that is a positive integer but "
                f"got {size!r}. 64 keeps a host of 256 examples at a handful of reads per step."
            )

    @classmethod
    def blocks(cls, block_size: int) -> EpochOrder:
        return cls("block", block_size)

    @property
    def is_default(self) -> bool:
        """Whether this is the order of plans that do not name one (their JSON and fingerprint omit it)."""
        return self.kind == "feistel"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "block_size": self.block_size}

    @classmethod
    def from_dict(cls, data: Any) -> EpochOrder:
        if not isinstance(data, dict) or set(data) != {"kind", "block_size"}:
            raise PlanError(
                f"A plan's epoch_order must be an object with keys 'kind' and 'block_size' but got {data!r}."
            )
        return cls(data["kind"], data["block_size"])

    def describe(self) -> str:
        return "feistel (per record)" if self.kind == "feistel" else f"block (blocks of {self.block_size} records)"


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
) -> EpochPermutation | BlockPermutation:
    """The permutation of ``task``'s ``size`` records in ``epoch`` (>= 1) under ``order``."""
    if order.kind == "feistel":
        return _epoch_permutation(seed, task, epoch, size)
    assert order.block_size is not None
    return block_permutation(seed, task, epoch, size, order.block_size)


# As for the per-record order: a batch touches few (task, epoch) pairs; remember recent ones.
@functools.lru_cache(maxsize=4096)
def block_permutation(seed: int, task: str, epoch: int, size: int, block_size: int) -> BlockPermutation:
    return BlockPermutation.for_epoch(seed, task, epoch, size, block_size)
