"""A tiny Adam (Kingma & Ba, with bias correction) over flat ``{name: array}`` parameter dicts.

Its state is flat too (``mu.<name>``, ``nu.<name>``, ``count``), so it is checkpointed next to the
parameters in one ``.npz`` and sharded exactly like them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

__all__ = ["AdamConfig", "adam_specs", "adam_update", "init_adam"]


@dataclasses.dataclass(frozen=True)
class AdamConfig:
    learning_rate: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ValueError(f"Learning rate must be > 0 but got {self.learning_rate!r}.")
        for name in ("b1", "b2"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"Adam {name} must be in [0, 1) but got {value!r}.")
        if not self.eps > 0:
            raise ValueError(f"Adam eps must be > 0 but got {self.eps!r}.")


def init_adam(params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    state: dict[str, np.ndarray] = {"count": np.zeros((), dtype=np.int32)}
    for name, value in params.items():
        state[f"mu.{name}"] = np.zeros_like(value)
        state[f"nu.{name}"] = np.zeros_like(value)
    return state


def adam_specs(param_specs: Mapping[str, PartitionSpec]) -> dict[str, PartitionSpec]:
    specs = {"count": PartitionSpec()}
    for name, spec in param_specs.items():
        specs[f"mu.{name}"] = spec
        specs[f"nu.{name}"] = spec
    return specs


def adam_update(
    params: Mapping[str, jax.Array],
    grads: Mapping[str, jax.Array],
    state: Mapping[str, jax.Array],
    config: AdamConfig,
) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    count = state["count"] + 1
    t = count.astype(jnp.float32)
    correction1 = 1 - config.b1**t
    correction2 = 1 - config.b2**t
    new_params, new_state = {}, {"count": count}
    for name, value in params.items():
        mu = config.b1 * state[f"mu.{name}"] + (1 - config.b1) * grads[name]
        nu = config.b2 * state[f"nu.{name}"] + (1 - config.b2) * grads[name] ** 2
        step = config.learning_rate * (mu / correction1) / (jnp.sqrt(nu / correction2) + config.eps)
        new_params[name] = value - step
        new_state[f"mu.{name}"], new_state[f"nu.{name}"] = mu, nu
    return new_params, new_state
