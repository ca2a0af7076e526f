"""``RunMapDataset``: a run as a map-style torch dataset whose index is the run's stream position.

    dataset = RunMapDataset(CacheRun("/data/caches", "c4_lm"), {"targets": 2048}, num_samples=train_samples)
    sampler = MegatronPretrainingSampler(len(dataset), consumed_samples, micro_batch_size, dp_rank, dp_size)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=2)

Item ``i`` is the example at position ``i`` of the run's stream, whatever asks for it: step ``s`` covers
positions ``[P(s), P(s) + B(s))`` (``RunPlan.positions``), so a trainer whose global batch is the plan's
and whose consumed-samples counter is ``P(s)`` at step ``s`` (Megatron's ``consumed_samples``) reads
exactly the run's global batches, split among its data-parallel ranks however its sampler splits them,
and resumes from a checkpoint's counter on any number of ranks. Stages, mixture rates and later epochs
are the plan's, computed in O(1) per position by the index math.

A skipped step (``taskdata plan --skip``) keeps its positions and examples, as in the plan: a sampler
walking positions reads them. Megatron discards them itself when told ``--iterations-to-skip``
(``trainer_client.pytorch.megatron.iterations_to_skip`` lists them): it reads and drops that iteration's
samples, as the plan keeps the step's positions.

Each item is ``{feature: int32 [length]}`` (zero-padded; a packed cache's rows also carry
``{feature}_segment_ids`` and ``{feature}_positions``), as torch tensors or, with ``tensors=False``, numpy
arrays, or what ``transform`` makes of that (``trainer_client.pytorch.megatron.gpt_sample``: Megatron's GPT
sample); the default collate stacks them into ``[batch, length]``. ``DataLoader`` fetches a batch's indices
together (``__getitems__``): consecutive positions of one step are read as one slice of the step, with the
same verified reads as the trainer client's. Every process that reads (each ``DataLoader`` worker) opens
its own source from ``open_source``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from taskdata.index import RunPlan
from trainer_client.assignments import HostSlice
from trainer_client.local_source import LocalAssignments
from trainer_client.reading import BatchReader

__all__ = ["RunMapDataset"]

Sample = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class _Opened:
    """What one process reads with: its source (over the plan without skip ranges) and reader."""

    pid: int
    plan: RunPlan  # the run's own plan, skip ranges included
    source: LocalAssignments
    reader: BatchReader


class RunMapDataset(Dataset[Sample]):
    """The examples at positions ``0 .. num_samples - 1`` of a run, by position.

    Args:
      open_source: opens the run's ``LocalAssignments`` (e.g. ``CacheRun(cache_root, run)``; picklable
        when ``DataLoader`` workers are started by spawn).
      lengths: the padded length of every feature to read, e.g. ``{"targets": 2048}``.
      num_samples: the dataset's length (the samples training reads, e.g. Megatron's ``train_iters *
        global_batch_size``); every position has an example (epochs repeat), so any length is valid.
      tensors: torch tensors (default) or numpy arrays.
      transform: applied to every item (e.g. ``gpt_sample``), in the process that reads it.
      verify_crc: check every record's CRCs as it is read.
    """

    def __init__(
        self,
        open_source: Callable[[], LocalAssignments],
        lengths: Mapping[str, int],
        *,
        num_samples: int,
        tensors: bool = True,
        transform: Callable[[Sample], Sample] | None = None,
        verify_crc: bool = True,
    ):
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer but got {num_samples!r}.")
        if not callable(open_source):
            raise TypeError(
                f"open_source must be a callable that opens the run's source, e.g. CacheRun(cache_root, run), "
                f"but got {open_source!r}."
            )
        self._open_source = open_source
        self._lengths = dict(lengths)
        self._num_samples = num_samples
        self._tensors = tensors
        self._transform = transform
        self._verify_crc = verify_crc
        self._opened: _Opened | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Open files stay in the process that opened them; another process opens its own.
        return {**self.__dict__, "_opened": None}

    def __len__(self) -> int:
        return self._num_samples

    @property
    def plan(self) -> RunPlan:
        """The run's plan (skip ranges included)."""
        return self._open().plan

    def __getitem__(self, index: int) -> Sample:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Sample]:
        """The items at ``indices``, in order (what ``DataLoader`` asks for a batch)."""
        for index in indices:
            if isinstance(index, bool) or not isinstance(index, int | np.integer) or not 0 <= index < len(self):
                raise IndexError(
                    f"Index {index!r} is not a position of this dataset: it holds positions 0..{len(self) - 1} "
                    "of the run (num_samples). Build it with a larger num_samples to read further."
                )
        opened = self._open()
        out: list[Sample] = []
        for start, stop in _consecutive([int(i) for i in indices]):
            for step, host_slice in _slices(opened.plan, start, stop):
                reads = opened.source.fetch(step, 1, host_slice)[0]
                features = opened.reader.read(reads).features
                out.extend(self._rows(features))
        return out

    def _rows(self, features: Mapping[str, np.ndarray]) -> list[Sample]:
        count = len(next(iter(features.values())))
        if self._tensors:
            arrays: Mapping[str, Any] = {name: torch.from_numpy(array) for name, array in features.items()}
        else:
            arrays = features
        rows = [{name: array[row] for name, array in arrays.items()} for row in range(count)]
        return rows if self._transform is None else [self._transform(row) for row in rows]

    def _open(self) -> _Opened:
        pid = os.getpid()
        if self._opened is None or self._opened.pid != pid:
            source = self._open_source()
            if not isinstance(source, LocalAssignments):
                kind = type(source).__name__
                source.close()
                raise TypeError(
                    f"RunMapDataset reads the cache itself (LocalAssignments, e.g. CacheRun(cache_root, run)), but "
                    f"open_source gave a {kind}. Read a server's run with RunIterableDataset instead."
                )
            plan = source.run_info().plan
            if plan.skip:
                # The same run and fingerprint without skip ranges: every position keeps its example.
                everything = LocalAssignments(dataclasses.replace(plan, skip=()), source.version_dirs)
                source.close()
                source = everything
            reader = BatchReader(source.run_info(), self._lengths, verify_crc=self._verify_crc)
            self._opened = _Opened(pid, plan, source, reader)
        return self._opened

    def close(self) -> None:
        """Closes this process's files (reading again opens them again)."""
        if self._opened is not None and self._opened.pid == os.getpid():
            self._opened.reader.close()
            self._opened.source.close()
        self._opened = None


def _consecutive(indices: list[int]) -> list[tuple[int, int]]:
    """``indices`` as runs ``[start, stop)`` of consecutive integers, in order."""
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs


def _slices(plan: RunPlan, start: int, stop: int) -> list[tuple[int, HostSlice]]:
    """Positions ``[start, stop)`` as equal host slices of their steps, in order: a piece of a step at offset
    ``o`` of ``n`` positions is ``n / g`` slices of ``g = gcd(o, n, B)`` (one slice when it is aligned)."""
    out: list[tuple[int, HostSlice]] = []
    while start < stop:
        step = plan.step_of(start)
        first, size = plan.first_position(step), plan.batch_size(step)
        end = min(stop, first + size)
        offset, count = start - first, end - start
        width = math.gcd(offset, count, size)
        out.extend((step, HostSlice(offset // width + k, size // width)) for k in range(count // width))
        start = end
    return out
