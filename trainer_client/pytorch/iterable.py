"""``RunIterableDataset``: a rank's host batches of consecutive steps, as a ``Stateful`` torch dataset.

    dataset = RunIterableDataset(CacheRun("/data/caches", "c4_lm"), {"targets": 2048},
                                 host_slice=HostSlice(dp_rank, dp_size))
    loader = StatefulDataLoader(dataset, batch_size=None)          # or torch's DataLoader, or iter(dataset)
    for element in loader:                                         # {"targets": int32 [rows, 2048], "step": int64}
        ...
        dcp.save({"model": model.state_dict(), "data": dataset})   # or "data": loader (torchdata)
    ...
    dcp.load({"model": model_state, "data": dataset})              # then iterate again: the next step

Each element is one step's host batch, exactly what ``DataIterator`` yields for that step (read ahead in
background threads, or in ``workers`` processes), as torch tensors with its ``step``; a step the plan skips
yields no element. ``state_dict()`` is the data state, ``{"step": next step, "fingerprint": ...}``
(``DataState``): one step of one run, the same on every rank, so ``torch.distributed.checkpoint`` keeps one
copy and any number of ranks loads it. ``load_state_dict`` moves the dataset (and its running iterator) to
that step, on whatever host slice this rank reads now: saved on 2 ranks, loaded on 1 or 4, the global
batches are those of an uninterrupted run. A state of another run is refused (``ResumeError``).

torchdata's ``StatefulDataLoader`` saves and restores it through the dataset and its iterator (both
``Stateful``), without fast-forwarding. Use ``batch_size=None`` (an element is already a batch) and
``num_workers=0``: ``DataLoader`` worker processes would each read every step, so the dataset refuses to be
read by them, naming the loader's ``num_workers``; read in processes with ``workers=N`` instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from trainer_client.assignments import AssignmentSource, HostSlice, RunInfo
from trainer_client.iterator import DataIterator, DataState, ResumeError

__all__ = ["STEP_KEY", "RunBatches", "RunIterableDataset"]

STEP_KEY = "step"
Element = dict[str, torch.Tensor]


class RunBatches(Iterator[Element]):
    """The iterator of a ``RunIterableDataset``: its elements from one step on; ``Stateful`` too."""

    def __init__(self, iterator: DataIterator):
        self._iterator = iterator

    def __next__(self) -> Element:
        while True:
            batch = next(self._iterator)
            if not batch.skipped:
                element = {name: torch.from_numpy(array) for name, array in batch.features.items()}
                element[STEP_KEY] = torch.tensor(batch.step, dtype=torch.int64)
                return element

    def state_dict(self) -> dict[str, Any]:
        """The data state after every element yielded so far."""
        return self._iterator.state().to_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Goes on from the state's step (``ResumeError`` for another run's state)."""
        self._iterator.restore(DataState.from_dict(dict(state_dict)))

    def close(self) -> None:
        self._iterator.close()

    def __del__(self) -> None:
        if not sys.is_finalizing():
            self._iterator.close()


class RunIterableDataset(IterableDataset[Element]):
    """A run's host batches for this rank from ``start`` on.

    Args:
      open_source: opens the run's ``AssignmentSource`` in the process that reads (e.g.
        ``CacheRun(cache_root, run)``, or ``functools.partial(ServerAssignments, url, run, token=...)``).
      lengths: the padded length of every feature to read, e.g. ``{"targets": 2048}``.
      host_slice: the slice of every global batch this rank reads: ``HostSlice(dp_rank, dp_size)``. By
        default torch.distributed's rank and world size (0 of 1 when it is not initialised); with tensor or
        pipeline parallelism give the data-parallel coordinate instead.
      start: the first step (an int), or a ``DataState`` to resume from.
      stop_step: the step to stop before (None: read on while the run has steps).
      workers, lookahead, prefetch, verify_crc: as for ``DataIterator``.
    """

    def __init__(
        self,
        open_source: Callable[[], AssignmentSource],
        lengths: Mapping[str, int],
        *,
        host_slice: HostSlice | None = None,
        start: int | DataState = 0,
        stop_step: int | None = None,
        workers: int = 0,
        lookahead: int = 16,
        prefetch: int = 4,
        verify_crc: bool = True,
    ):
        if STEP_KEY in lengths:
            raise ValueError(
                f"A feature cannot be named {STEP_KEY!r} in an element: that key holds the step. Rename the "
                "feature in the task's output features."
            )
        if not callable(open_source):
            raise TypeError(
                f"open_source must be a callable that opens the run's source, e.g. CacheRun(cache_root, run), "
                f"but got {open_source!r}."
            )
        if not isinstance(start, DataState) and (isinstance(start, bool) or not isinstance(start, int) or start < 0):
            raise ResumeError(f"start must be a step (int >= 0) or a DataState but got {start!r}.")
        self._open_source = open_source
        self._lengths = dict(lengths)
        self._host_slice = host_slice
        self._options: dict[str, Any] = {
            "stop_step": stop_step,
            "workers": workers,
            "lookahead": lookahead,
            "prefetch": prefetch,
            "verify_crc": verify_crc,
        }
        self._info: RunInfo | None = None
        self._start: int | DataState = start
        self._live: RunBatches | None = None
        if isinstance(start, DataState):
            self._check(start)

    def __getstate__(self) -> dict[str, Any]:
        # A running iterator (threads, open files) and the plan stay in this process.
        return {**self.__dict__, "_info": None, "_live": None}

    @property
    def info(self) -> RunInfo:
        """The run (its plan opened once per process)."""
        if self._info is None:
            source = self._open_source()
            try:
                self._info = source.run_info()
            finally:
                source.close()
        return self._info

    @property
    def host_slice(self) -> HostSlice:
        if self._host_slice is not None:
            return self._host_slice
        if dist.is_available() and dist.is_initialized():
            return HostSlice(dist.get_rank(), dist.get_world_size())
        return HostSlice(0, 1)

    def __iter__(self) -> RunBatches:
        worker = get_worker_info()
        if worker is not None:
            raise RuntimeError(
                f"RunIterableDataset is being read by DataLoader worker {worker.id} of {worker.num_workers} "
                f"(num_workers={worker.num_workers}): every worker would read every step, repeating each batch "
                f"{worker.num_workers} times. Build the DataLoader (or StatefulDataLoader) with num_workers=0, and "
                f"read in processes with RunIterableDataset(..., workers={worker.num_workers})."
            )
        if self._live is not None:
            self._start = DataState.from_dict(self._live.state_dict())
            self._live.close()
        iterator = DataIterator(
            self._open_source(), self._lengths, start=self._start, host_slice=self.host_slice, **self._options
        )
        self._live = RunBatches(iterator)
        return self._live

    def state_dict(self) -> dict[str, Any]:
        """The data state: where the running iterator stands, else where the next one starts."""
        if self._live is not None:
            return self._live.state_dict()
        start = self._start
        if isinstance(start, int):
            start = DataState(start, self.info.plan.fingerprint_before(start))
        return start.to_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Moves to the state's step: the running iterator at once, a later ``iter()`` from there."""
        state = DataState.from_dict(dict(state_dict))
        self._check(state)
        self._start = state
        if self._live is not None:
            self._live.load_state_dict(state.to_dict())

    def _check(self, state: DataState) -> None:
        plan = self.info.plan
        expected = plan.fingerprint_before(state.step)
        if state.fingerprint != expected:
            raise ResumeError(
                f"The data state belongs to a run with fingerprint {state.fingerprint}, but run {plan.name!r} has "
                f"fingerprint {expected} (of the steps before the state's step {state.step}): its batches would "
                "differ from the ones trained on. Resume against the run the checkpoint was made with."
            )

    def close(self) -> None:
        """Stops the running iterator's threads and closes its source."""
        if self._live is not None:
            self._live.close()
            self._live = None
