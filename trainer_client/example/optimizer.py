"""The example trainer's optimizer: optax's Adam, its state sharded like the parameters it tracks.

``opt_state_shardings`` gives every leaf of the optax state a sharding: the moment estimates get their
parameter's, the rest (Adam's step count) is replicated. Initialising the state through ``jax.jit``
with these as ``out_shardings`` matters on several processes: left to itself, ``jit(tx.init)`` puts
the count, a constant, on one device, and orbax cannot save such an array from a multi-process job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import optax
from jax.sharding import NamedSharding

__all__ = ["init_opt_state", "make_optimizer", "opt_state_shardings"]


def make_optimizer(learning_rate: float) -> optax.GradientTransformation:
    if not learning_rate > 0:
        raise ValueError(f"Learning rate must be > 0 but got {learning_rate!r}.")
    return optax.adam(learning_rate)


def opt_state_shardings(
    tx: optax.GradientTransformation,
    param_shardings: Mapping[str, NamedSharding],
    shapes: Mapping[str, jax.ShapeDtypeStruct],
    replicated: NamedSharding,
) -> Any:
    """The optax state's tree with a sharding at every leaf."""
    abstract = jax.eval_shape(tx.init, dict(shapes))
    return optax.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        abstract,
        dict(param_shardings),
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def init_opt_state(tx: optax.GradientTransformation, params: Mapping[str, jax.Array], shardings: Any) -> Any:
    return jax.jit(tx.init, out_shardings=shardings)(dict(params))
