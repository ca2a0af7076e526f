"""The data state as an orbax checkpoint item, saved in the same orbax step as the model state.

    import orbax.checkpoint as ocp
    from trainer_client.orbax_state import DataCheckpointRestore, DataCheckpointSave

    manager = ocp.CheckpointManager(directory)
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state), data=DataCheckpointSave(iterator)))
    ...
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=DataCheckpointRestore(iterator)))

The args/handler pair is registered with orbax the way Grain registers its iterator handler
(``ocp.args.register_with_handler``), so a ``CheckpointManager`` needs no ``item_handlers`` for it
(importing this module registers it). The item may be a ``DataIterator``, a ``DataState``, or a Grain
iterator over a run (``trainer_client.grain_dataset``); restoring into an iterator moves it to the
saved step in place (``DataIterator.restore``), restoring without one returns the ``DataState``.

On disk a step holds ``data/process_{i}-of-{n}.json`` per process, each ``{"fingerprint", "step"}``
(well under 1 KB): the state is global (one step of one run), so every process writes the same one.
A restore on the same number of processes reads its own file; on another number it reads every
saved file and requires them to agree, then each host resumes that step with its own slice of it
(Grain's handler instead refuses another process count). A state of another run is refused with
``DataIterator``'s ``ResumeError``.

Orbax runs a handler that is not asynchronous inside ``CheckpointManager.save``, before it returns,
while the arrays are written in the background: the state saved is the one at the save call, and
writing it takes a small file write, so asynchronous checkpointing keeps the train loop fed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Protocol

import jax
import orbax.checkpoint as ocp
from etils import epath

from trainer_client.iterator import DataIterator, DataState, ResumeError

__all__ = ["MAX_STATE_BYTES", "DataCheckpointHandler", "DataCheckpointRestore", "DataCheckpointSave"]

MAX_STATE_BYTES = 1024
_FILE = re.compile(r"^process_(\d+)-of-(\d+)\.json$")


class _StatefulIterator(Protocol):
    """A Grain iterator over a run (``trainer_client.grain_dataset``): its state is a ``DataState``'s dict."""

    def get_state(self) -> dict[str, Any]: ...

    def set_state(self, state: dict[str, Any]) -> None: ...


def _state_of(item: DataIterator | DataState | _StatefulIterator) -> DataState:
    if isinstance(item, DataState):
        return item
    if isinstance(item, DataIterator):
        return item.state()
    if hasattr(item, "get_state"):  # a Grain iterator over a run: its state is a DataState's dict
        return DataState.from_dict(item.get_state())
    raise TypeError(
        f"DataCheckpointSave takes a DataIterator, a DataState or a Grain iterator over a run but got "
        f"{type(item).__name__}."
    )


def _file_name(index: int, count: int) -> str:
    return f"process_{index}-of-{count}.json"


class DataCheckpointHandler(ocp.CheckpointHandler):
    """Saves and restores a run's data state, one small JSON file per process."""

    def save(self, directory: epath.Path, args: DataCheckpointSave) -> None:
        text = json.dumps(_state_of(args.item).to_dict(), sort_keys=True)
        if len(text.encode()) > MAX_STATE_BYTES:
            raise ResumeError(
                f"A data state is at most {MAX_STATE_BYTES} bytes of JSON but this one is {len(text.encode())}: "
                f"{text[:200]}... Its fingerprint must be the run's (64 hex digits)."
            )
        (directory / _file_name(jax.process_index(), jax.process_count())).write_text(text)

    def restore(
        self, directory: epath.Path, args: DataCheckpointRestore | None = None
    ) -> DataState | DataIterator | _StatefulIterator:
        state = self._read(directory)
        item = None if args is None else args.item
        if item is None:
            return state
        if isinstance(item, DataIterator):
            item.restore(state)
        elif hasattr(item, "set_state"):
            item.set_state(state.to_dict())
        else:
            raise TypeError(
                f"DataCheckpointRestore takes a DataIterator, a Grain iterator over a run, or nothing (to get "
                f"the DataState) but got {type(item).__name__}."
            )
        return item

    def _read(self, directory: epath.Path) -> DataState:
        own = directory / _file_name(jax.process_index(), jax.process_count())
        if own.exists():
            return DataState.from_dict(json.loads(own.read_text()))
        files = sorted(p for p in directory.iterdir() if _FILE.match(p.name))
        if not files:
            raise ResumeError(
                f"{directory} holds no data state (process_*-of-*.json): it is not a checkpoint item written by "
                "DataCheckpointSave. Restore the item that was saved under this name."
            )
        states = {p.name: DataState.from_dict(json.loads(p.read_text())) for p in files}
        if len(set(states.values())) != 1:
            raise ResumeError(
                f"The processes that saved {directory} were at different data states {states}; a state that is "
                f"not one global step cannot be resumed on {jax.process_count()} processes. Resume on the "
                "number of processes that saved it."
            )
        return next(iter(states.values()))

    def metadata(self, directory: epath.Path) -> None:
        return None

    def finalize(self, directory: epath.Path) -> None:
        pass

    def close(self) -> None:
        pass


@ocp.args.register_with_handler(DataCheckpointHandler, for_save=True)
@dataclasses.dataclass
class DataCheckpointSave(ocp.args.CheckpointArgs):
    """Saves ``item``'s data state: a ``DataIterator``, a ``DataState`` or a Grain iterator over a run."""

    item: DataIterator | DataState | _StatefulIterator


@ocp.args.register_with_handler(DataCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class DataCheckpointRestore(ocp.args.CheckpointArgs):
    """Restores into ``item`` (moved to the saved step in place), or returns the ``DataState`` when None."""

    item: DataIterator | _StatefulIterator | None = None
