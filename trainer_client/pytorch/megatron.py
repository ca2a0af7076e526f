"""Megatron-LM's side of a run: its GPT sample layout, and the iterations to skip where the plan skips steps.

    def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):   # pretrain_gpt.py's
        train = RunMapDataset(CacheRun(cache_root, run), {"targets": args.seq_length},
                              num_samples=train_val_test_num_samples[0], transform=gpt_sample)
        return train, None, None

Megatron builds its sampler (``MegatronPretrainingSampler``, from the checkpoint's ``consumed_samples``) and
its ``DataLoader`` around the dataset itself (``--dataloader-type single``); ``RunMapDataset`` answers every
global sample index with the example at that position of the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from taskdata.example.packing import positions_name, segment_ids_name
from trainer_client.pytorch.labels import IGNORE_INDEX, next_token_labels
from trainer_client.pytorch.map_dataset import RunMapDataset

__all__ = ["gpt_sample", "iterations_to_skip"]


def gpt_sample(item: Mapping[str, Any], feature: str = "targets") -> dict[str, torch.Tensor]:
    """An item of ``RunMapDataset`` as Megatron's GPT dataset gives a sample (what its ``get_batch`` reads).

    ``tokens`` is the row (int64), ``labels`` the next token within the same example, ``loss_mask`` 1.0 where
    a label is trained and 0.0 at every example's end and on padding (where ``labels`` holds 0, as
    Megatron's does), ``position_ids`` each token's position in its example.
    """
    tokens = np.asarray(item[feature]).astype(np.int64)
    segments = item.get(segment_ids_name(feature))
    labels = next_token_labels(tokens, segment_ids=None if segments is None else np.asarray(segments))
    trained = labels != IGNORE_INDEX
    if positions_name(feature) in item:
        positions = np.asarray(item[positions_name(feature)]).astype(np.int64)
    else:
        positions = np.arange(tokens.shape[-1], dtype=np.int64)
    return {
        "tokens": torch.from_numpy(tokens),
        "labels": torch.from_numpy(np.where(trained, labels, 0)),
        "loss_mask": torch.from_numpy(trained.astype(np.float32)),
        "position_ids": torch.from_numpy(positions),
    }


def iterations_to_skip(dataset: RunMapDataset, global_batch_size: int) -> list[int]:
    """Megatron's ``--iterations-to-skip`` for the plan's skipped steps within ``dataset``.

    Megatron's iteration ``s + 1`` is the plan's step ``s`` when both read the same positions: each skipped
    step must cover positions ``[s * global_batch_size, (s + 1) * global_batch_size)``, else this raises.
    """
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a positive integer but got {global_batch_size!r}.")
    plan = dataset.plan
    last_step = plan.step_of(len(dataset) - 1)
    iterations = []
    for skip in plan.skip:
        for step in range(skip.start, min(skip.stop, last_step + 1)):
            expected = range(step * global_batch_size, (step + 1) * global_batch_size)
            if plan.positions(step) != expected:
                raise ValueError(
                    f"Step {step} of run {plan.name!r} is skipped, but it covers positions {plan.positions(step)}, "
                    f"while Megatron's iteration {step + 1} with a global batch of {global_batch_size} reads "
                    f"{expected}. Train with the plan's global batch size ({plan.batch_size(step)} at that step) "
                    "and no --rampup-batch-size, so that iterations and steps are the same."
                )
            iterations.append(step + 1)
    return iterations
