"""Runs in the torchtitan environment (deploy/torchtitan_env.sh) for tests/test_torchtitan_loader.py; prints JSON.

    .venv-torchtitan/bin/python -m tests.torchtitan_check ROOT CHECKPOINT_DIR

``TaskdataDataLoader`` is built the way torchtitan 0.3.0's trainer builds its data loader (``config.dataloader
.build(...)`` with the trainer's keyword arguments) on 2 data-parallel ranks of run ``mix2`` (global batch 16:
two micro batches of 4 rows per rank and step). It reads 3 steps, saves rank 0's state with
``torch.distributed.checkpoint`` (what torchtitan's checkpointer saves it with), loads it on 1 and on 4 ranks
and reads 3 more steps. Printed: every step's global batch (ranks' micro batches in order) as lists, per
layout; the IGNORE_INDEX torchtitan uses; what a checkpoint inside a step and another run's state raise.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed.checkpoint as dcp
from torchtitan.components.loss import IGNORE_INDEX

from trainer_client.pytorch.torchtitan import TaskdataDataLoader

SEQ_LEN, LOCAL_BATCH = 176, 4  # the toy caches' targets; micro batches of 4 rows


def build(config: TaskdataDataLoader.Config, rank: int, ranks: int) -> TaskdataDataLoader:
    # The keyword arguments torchtitan 0.3.0's Trainer passes (torchtitan/trainer.py, "build dataloader").
    return config.build(dp_world_size=ranks, dp_rank=rank, tokenizer=None, seq_len=SEQ_LEN,
                        local_batch_size=LOCAL_BATCH, snapshot_every_n_steps=None)


def read_steps(loaders: list[TaskdataDataLoader], iterators: list, steps: int) -> list[dict]:
    """``steps`` global batches: each rank takes its step's micro batches, ranks in order."""
    out = []
    for _ in range(steps):
        parts: dict[str, list[torch.Tensor]] = {"input": [], "positions": [], "labels": []}
        for iterator in iterators:
            for _ in range(16 // len(loaders) // LOCAL_BATCH):  # the micro batches of a step, per rank
                inputs, labels = next(iterator)
                parts["input"].append(inputs["input"])
                parts["positions"].append(inputs["positions"])
                parts["labels"].append(labels)
        batch = {k: torch.cat(v) for k, v in parts.items()}
        out.append({k: {"dtype": str(v.dtype), "values": v.tolist()} for k, v in batch.items()})
    return out


def main() -> None:
    root, checkpoint = sys.argv[1], sys.argv[2]
    config = TaskdataDataLoader.Config(cache_root=root, run="mix2")
    report: dict = {"ignore_index": IGNORE_INDEX}

    loaders = [build(config, rank, 2) for rank in range(2)]
    iterators = [iter(loader) for loader in loaders]
    report["before"] = read_steps(loaders, iterators, 3)
    states = [loader.state_dict() for loader in loaders]
    report["states_equal"] = states[0] == states[1]
    dcp.save({"dataloader": loaders[0]}, checkpoint_id=checkpoint)
    next(iterators[0])  # one micro batch of step 3: a checkpoint now would fall inside the step
    try:
        loaders[0].state_dict()
    except RuntimeError as error:
        report["inside_a_step"] = str(error)
    for loader in loaders:
        loader.close()

    report["after"] = {}
    for ranks in (1, 4):
        resumed = [build(config, rank, ranks) for rank in range(ranks)]
        for loader in resumed:
            dcp.load({"dataloader": loader}, checkpoint_id=checkpoint)  # calls load_state_dict
        report["after"][ranks] = read_steps(resumed, [iter(loader) for loader in resumed], 3)
        for loader in resumed:
            loader.close()

    other = build(TaskdataDataLoader.Config(cache_root=root, run="other_seed"), 0, 2)
    try:
        dcp.load({"dataloader": other}, checkpoint_id=checkpoint)
    except Exception as error:  # what DCP raises around it is reported as is
        report["other_run"] = f"{type(error).__name__}: {error}"
    other.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
