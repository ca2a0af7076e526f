"""Epoch orders: how a run orders each task's records in the epochs after the first, one module each.

- ``feistel`` (``FeistelOrder``, what every plan without the option reads): each epoch is its own keyed
  per-record permutation.
- ``block`` (``BlockOrder``): each epoch is a keyed shuffle of blocks of ``block_size`` contiguous
  records, so a host's reads per step stay bounded.
- ``windowed`` (``WindowedOrder``, new runs' default): the block order's kind of blocks, each dealt out
  one record a step at one place of the batch, so a client that reads ahead reads a block once and a
  batch holds records of many blocks.

Every order is an ``EpochOrder`` (``base``): a plan holds one, and the index chain asks it for each
(task, epoch)'s permutation and applies them without knowing which order it is. A new order is one
module with an ``EpochOrder`` subclass, registered in ``ORDERS`` below; plans name it by its ``kind``
(``epoch_order``, ``epoch_order_from_dict``), and so does ``taskdata plan --epoch-order``.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

from taskdata.index.errors import PlanError
from taskdata.index.orders.base import EpochOrder, EpochPermutation
from taskdata.index.orders.block import BlockOrder
from taskdata.index.orders.feistel import FeistelOrder
from taskdata.index.orders.windowed import WindowedOrder

__all__ = ["FEISTEL", "ORDERS", "EpochOrder", "EpochPermutation", "epoch_order", "epoch_order_from_dict"]

ORDERS: types.MappingProxyType[str, type[EpochOrder]] = types.MappingProxyType(
    {order.kind: order for order in (FeistelOrder, BlockOrder, WindowedOrder)}
)

# The order of plans that do not name one (their JSON and fingerprint leave it out).
FEISTEL = FeistelOrder()


def epoch_order(kind: str, **options: Any) -> EpochOrder:
    """The order of this ``kind`` with these options, e.g. ``epoch_order("block", block_size=64)``."""
    cls = ORDERS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise PlanError(f"Epoch order must be one of {sorted(ORDERS)} but got {kind!r}.")
    assert dataclasses.is_dataclass(cls)
    fields = [field.name for field in dataclasses.fields(cls)]
    if sorted(options) != sorted(fields):
        takes = f"the options {fields}" if fields else "no options"
        raise PlanError(
            f"The {kind} epoch order takes {takes} but got {sorted(options) or 'none'}"
            + (f". For example: {_EXAMPLES[kind]}." if kind in _EXAMPLES else ".")
        )
    return cls(**options)


_EXAMPLES = {
    "block": "epoch_order('block', block_size=64), or taskdata plan --epoch-order block --block-size 64",
    "windowed": "epoch_order('windowed', block_size=64, width=2048), or taskdata plan --epoch-order windowed "
    "--block-size 64 --width 2048",
}


def epoch_order_from_dict(data: Any) -> EpochOrder:
    """The order a plan's JSON names: ``{"kind": ..., **options}`` (``EpochOrder.to_dict``)."""
    if not isinstance(data, dict) or "kind" not in data:
        raise PlanError(
            f"A plan's epoch_order must be an object with its 'kind' and options (e.g. {{'kind': 'block', "
            f"'block_size': 64}}) but got {data!r}."
        )
    # An option written as null is an option the order does not take (a feistel order once wrote
    # "block_size": null).
    options = {key: value for key, value in data.items() if value is not None}
    return epoch_order(options.pop("kind", None), **options)
