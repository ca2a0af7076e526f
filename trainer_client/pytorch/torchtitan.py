"""``TaskdataDataLoader``: torchtitan's data loader over a taskdata run (torchtitan 0.3.0's loader contract).

    from trainer_client.pytorch.torchtitan import TaskdataDataLoader

    config = llama3_debugmodel()                    # any torchtitan Trainer.Config
    config.dataloader = TaskdataDataLoader.Config(cache_root="/data/caches", run="c4_lm")

torchtitan's trainer builds it as it builds its own (``config.dataloader.build(dp_world_size=, dp_rank=,
tokenizer=, seq_len=, local_batch_size=, ...)``) and reads ``(input_dict, labels)`` micro batches from it:
``input_dict["input"]`` is ``local_batch_size`` rows of the feature (``targets`` by default, padded to
``seq_len``), ``input_dict["positions"]`` each token's position in its example (a packed cache's own
positions; ``0 .. seq_len - 1`` for one example per row), and ``labels`` the next token within the same
example, ``IGNORE_INDEX`` at every example's end and on padding (``next_token_labels``), all int64.

Data-parallel rank ``r`` of ``n`` reads host slice ``r`` of ``n`` of every step, in the plan's order, and one
torchtitan step trains one step of the run: the slice's rows, ``global batch / n``, must be the
micro batches the trainer takes per step (``gradient accumulation steps * pipeline micro batches`` of
``local_batch_size`` rows), which the plan's global batch equal to torchtitan's ``global_batch_size`` gives.
The state it checkpoints (through torchtitan's checkpointer, ``torch.distributed.checkpoint``) is the data
state, ``{"taskdata": {"step", "fingerprint"}}``, the same on every rank: unlike torchtitan's own loaders,
which refuse a new data-parallel degree, it resumes at that step on any number of data-parallel ranks, and
refuses another run's state (``ResumeError``). A checkpoint asked for in the middle of a step (the
micro batches of a step not all taken) is refused, naming the sizes to fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import IGNORE_INDEX as TORCHTITAN_IGNORE_INDEX

from taskdata.example.packing import positions_name, segment_ids_name
from trainer_client.assignments import HostSlice
from trainer_client.pytorch.iterable import RunIterableDataset
from trainer_client.pytorch.labels import IGNORE_INDEX, next_token_labels
from trainer_client.pytorch.source import CacheRun

__all__ = ["STATE_KEY", "TaskdataDataLoader"]

STATE_KEY = "taskdata"
Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


class TaskdataDataLoader(BaseDataLoader):
    """A taskdata run's rows as torchtitan micro batches; its state is the run's data state."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        cache_root: str = ""
        """The cache root the run is stored under (local or gs://)."""
        run: str = ""
        """The run's name (``taskdata plan --name``)."""
        feature: str = "targets"
        """The task feature that holds the tokens."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        seq_len: int,
        local_batch_size: int,
        **kwargs: Any,
    ):
        del kwargs  # the tokenizer and snapshot interval: the cache holds tokens, the state is one step
        if not config.cache_root or not config.run:
            raise ValueError(
                "TaskdataDataLoader.Config needs cache_root and run, e.g. "
                "TaskdataDataLoader.Config(cache_root='/data/caches', run='c4_lm')."
            )
        if TORCHTITAN_IGNORE_INDEX != IGNORE_INDEX:
            raise RuntimeError(
                f"torchtitan's IGNORE_INDEX is {TORCHTITAN_IGNORE_INDEX}, taskdata's {IGNORE_INDEX}: update taskdata."
            )
        self._feature = config.feature
        self._local_batch_size = local_batch_size
        self._dataset = RunIterableDataset(
            CacheRun(config.cache_root, config.run),
            {config.feature: seq_len},
            host_slice=HostSlice(dp_rank, dp_world_size),
        )
        self._step: int | None = None  # the step whose micro batches are being taken, and how many are left
        self._left = 0

    def __iter__(self) -> Iterator[Batch]:
        for element in self._dataset:
            tokens = element[self._feature].numpy()
            rows, length = tokens.shape
            if rows % self._local_batch_size:
                raise ValueError(
                    f"Step {int(element['step'])} gives this data-parallel rank {rows} rows, which micro batches of "
                    f"local_batch_size={self._local_batch_size} cannot split. Use a local batch size that divides "
                    f"the run's global batch divided by the data-parallel degree ({rows})."
                )
            segments = element.get(segment_ids_name(self._feature))
            labels = next_token_labels(tokens, segment_ids=None if segments is None else segments.numpy())
            if positions_name(self._feature) in element:
                positions = element[positions_name(self._feature)].numpy().astype(np.int64)
            else:
                positions = np.broadcast_to(np.arange(length, dtype=np.int64), tokens.shape)
            inputs = tokens.astype(np.int64)
            self._step, self._left = int(element["step"]), rows // self._local_batch_size
            for first in range(0, rows, self._local_batch_size):
                cut = slice(first, first + self._local_batch_size)
                self._left -= 1
                yield (
                    {"input": torch.from_numpy(inputs[cut]), "positions": torch.from_numpy(positions[cut].copy())},
                    torch.from_numpy(labels[cut]),
                )

    def state_dict(self) -> dict[str, Any]:
        if self._left:
            raise RuntimeError(
                f"A checkpoint was asked for inside step {self._step} of the run: {self._left} of its micro batches "
                f"of {self._local_batch_size} rows are not trained yet, and the data state is a step. Make one "
                "torchtitan step train one step of the run: training.global_batch_size equal to the run's global "
                "batch (its rows per data-parallel rank then split into the step's micro batches)."
            )
        return {STATE_KEY: self._dataset.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:  # torchtitan loads an empty state for a loader that saved none
            return
        if STATE_KEY not in state_dict:
            raise ValueError(
                f"The checkpoint's dataloader state {sorted(state_dict)} is not a taskdata run's (no {STATE_KEY!r}): "
                "it was saved by another data loader."
            )
        self._dataset.load_state_dict(state_dict[STATE_KEY])
        self._left = 0

    def close(self) -> None:
        self._dataset.close()
