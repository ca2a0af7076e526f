"""The example trainer's checkpoints: parameters, optax state and data state in one orbax step.

    {dir}/{step}/state/   {"params", "opt_state"} (orbax StandardSave: TensorStore arrays, no pickle)
    {dir}/{step}/data/    the data state: next step and run fingerprint (trainer_client.orbax_state)

Orbax writes a step into a temporary folder and renames it once every process has written its part;
saving is asynchronous (``save`` returns once the arrays are copied, they are written in the
background and committed by the next ``save``, ``wait_until_finished`` or ``close``). A kill at any
moment leaves the committed steps intact, and ``committed_steps`` never lists a partial one; the
temporary folder a killed save left is removed by the next manager's first save.
Every process must open the manager and call ``save``, ``restore``, ``wait_until_finished`` and
``close``: they hold barriers across processes.
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp

from trainer_client.iterator import DataState
from trainer_client.orbax_state import DataCheckpointHandler, DataCheckpointRestore, DataCheckpointSave

__all__ = ["CheckpointError", "checkpoint_manager", "committed_steps", "restore", "save", "saved_param_shapes"]


class CheckpointError(RuntimeError):
    """A checkpoint that does not fit this training run; the message names the fix."""


def checkpoint_manager(directory: str, keep: int) -> ocp.CheckpointManager:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an integer >= 1 but got {keep!r}: the checkpoint just written is kept.")
    return ocp.CheckpointManager(
        os.path.abspath(directory),
        item_handlers={"state": ocp.StandardCheckpointHandler(), "data": DataCheckpointHandler()},
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, cleanup_tmp_directories=True, enable_async_checkpointing=True
        ),
    )


def save(manager: ocp.CheckpointManager, train_state: dict[str, Any], data: DataState) -> None:
    """Starts saving ``train_state`` with ``data`` as the orbax step ``data.step`` (the next step to train)."""
    manager.save(
        data.step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(train_state), data=DataCheckpointSave(data)),
        force=True,
    )


def restore(
    manager: ocp.CheckpointManager, step: int, abstract_state: dict[str, Any]
) -> tuple[dict[str, Any], DataState]:
    """The train state of ``step``, placed as ``abstract_state``'s shardings say, and its data state."""
    restored = manager.restore(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=DataCheckpointRestore()),
    )
    data = restored["data"]
    if data.step != step:
        raise CheckpointError(
            f"Checkpoint {step} in {manager.directory} holds the data state of step {data.step}; they must agree. "
            "The folder was changed after it was written: resume from another step."
        )
    return restored["state"], data


def saved_param_shapes(manager: ocp.CheckpointManager, step: int) -> dict[str, tuple[int, ...]]:
    metadata = manager.item_metadata(step)["state"]
    return {name: tuple(value.shape) for name, value in metadata["params"].items()}


def committed_steps(directory: str) -> list[int]:
    """Steps of the committed checkpoints in ``directory``, oldest first (no JAX job needed)."""
    return sorted(ocp.utils.checkpoint_steps(os.path.abspath(directory)))
