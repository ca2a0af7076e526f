"""Megatron's GPT sample layout of a run's item: tokens, next-token labels (0 where not trained), the loss mask
and positions, for unpacked and packed rows."""

from __future__ import annotations

import numpy as np
import torch

from trainer_client.pytorch.megatron import gpt_sample


def test_an_unpacked_row_as_megatrons_gpt_sample():
    sample = gpt_sample({"targets": torch.tensor([5, 6, 7, 1, 0, 0], dtype=torch.int32)})
    assert sample["tokens"].tolist() == [5, 6, 7, 1, 0, 0] and sample["tokens"].dtype == torch.int64
    assert sample["labels"].tolist() == [6, 7, 1, 0, 0, 0] and sample["labels"].dtype == torch.int64
    assert sample["loss_mask"].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0] and sample["loss_mask"].dtype == torch.float32
    assert sample["position_ids"].tolist() == [0, 1, 2, 3, 4, 5]


def test_a_packed_rows_examples_keep_their_positions_and_never_label_each_other():
    sample = gpt_sample({
        "targets": np.array([11, 1, 21, 22, 1, 0], np.int32),
        "targets_segment_ids": np.array([1, 1, 2, 2, 2, 0], np.int32),
        "targets_positions": np.array([0, 1, 0, 1, 2, 0], np.int32),
    })
    assert sample["labels"].tolist() == [1, 0, 22, 1, 0, 0]
    assert sample["loss_mask"].tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert sample["position_ids"].tolist() == [0, 1, 0, 1, 2, 0]
