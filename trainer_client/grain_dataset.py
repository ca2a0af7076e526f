"""A run as a Grain dataset: ``RunIterDataset``, whose iterator's checkpointable state is our step.

    ds = RunIterDataset(ServerAssignments(url, "c4_sc"), {"inputs": 512, "targets": 114},
                        host_slice=HostSlice(jax.process_index(), jax.process_count()))
    it = iter(ds.map(make_decoder_inputs))           # any Grain transformations on the host batches
    manager.save(step, args=ocp.args.Composite(
        items=ocp.args.StandardSave(state), iter=grain.checkpoint.CheckpointSave(it)))
    ...
    manager.restore(step, args=ocp.args.Composite(
        items=ocp.args.StandardRestore(abstract), iter=grain.checkpoint.CheckpointRestore(it)))

For pipelines written with Grain: each element is one step's host batch, exactly what ``DataIterator``
yields for that step, plus its ``step`` (a dict of numpy arrays); a step that the plan skips yields no
element. The iterator's state (``get_state``) is a ``DataState``'s dict, the next step and the run
fingerprint, so Grain's own orbax handler (``grain.checkpoint.CheckpointSave`` / ``CheckpointRestore``)
checkpoints it, and ``set_state`` moves the underlying ``DataIterator`` to that step (``ResumeError`` for
another run). MaxText is not such a pipeline: it makes a batch array of every leaf (the scalar ``step``
fails), reads its own six fields and needs one batch per step, skipped ones included; its pipeline is
``trainer_client.maxtext``.
Grain's transformations that keep one element per input (``map``) pass the state through. Grain's
handler restores only on the number of processes that saved; ``trainer_client.orbax_state``'s
``DataCheckpointSave``/``Restore`` take the same iterators and restore on any number.

Reading ahead is the ``DataIterator``'s (threads); Grain's ``mp_prefetch`` worker processes do not
apply, since the dataset holds an open source and its state is one step, not per-worker positions.
The dataset owns its source and can be iterated once; build another one to read again.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import grain
import numpy as np

from trainer_client.assignments import AssignmentSource, HostSlice
from trainer_client.iterator import DataIterator, DataState

__all__ = ["STEP_KEY", "RunDatasetIterator", "RunIterDataset"]

STEP_KEY = "step"


class RunDatasetIterator(grain.DatasetIterator):
    """Yields ``{feature: int32 [rows, length], "step": int64}`` per step; its state is a ``DataState`` dict."""

    def __init__(self, iterator: DataIterator):
        super().__init__()
        self._iterator = iterator

    def __next__(self) -> dict[str, np.ndarray | np.int64]:
        self._assert_not_closed()
        while True:
            batch = next(self._iterator)
            if not batch.skipped:
                return {**batch.features, STEP_KEY: np.int64(batch.step)}

    def get_state(self) -> dict[str, Any]:
        return self._iterator.state().to_dict()

    def set_state(self, state: dict[str, Any]) -> None:
        self._iterator.restore(DataState.from_dict(state))

    def close(self) -> None:
        # Grain also closes iterators from __del__, which may run while the interpreter shuts down:
        # then the reading threads (daemons) simply end with it.
        if not self._closed and not sys.is_finalizing():
            self._iterator.close()
        super().close()


class RunIterDataset(grain.IterDataset):
    """A run's batches for this host from ``start`` (arguments as for ``DataIterator``)."""

    def __init__(
        self,
        source: AssignmentSource,
        lengths: Mapping[str, int],
        *,
        start: int | DataState = 0,
        host_slice: HostSlice | None = None,
        stop_step: int | None = None,
        lookahead: int | None = None,
        prefetch: int = 4,
        verify_crc: bool = True,
    ):
        super().__init__()
        if STEP_KEY in lengths:
            raise ValueError(
                f"A feature cannot be named {STEP_KEY!r} in a Grain element: that key holds the step. Rename "
                "the feature in the task's output features."
            )
        # Built now, so that a start state of another run fails here, and reading starts early.
        self._iterator = DataIterator(
            source,
            lengths,
            start=start,
            host_slice=host_slice,
            lookahead=lookahead,
            prefetch=prefetch,
            stop_step=stop_step,
            verify_crc=verify_crc,
        )
        self._taken = False

    def __iter__(self) -> RunDatasetIterator:
        if self._taken:
            raise RuntimeError(
                "A RunIterDataset is iterated once (it owns its source and iterator). Build another one with "
                "start=DataState(step, fingerprint) to read again from any step, or restore the iterator's state."
            )
        self._taken = True
        return RunDatasetIterator(self._iterator)

    def __str__(self) -> str:
        return f"RunIterDataset(run={self._iterator.info.name!r}, host_slice={self._iterator.host_slice})"
