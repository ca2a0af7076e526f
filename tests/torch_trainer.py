"""A small PyTorch trainer on a run, one process per rank (torch.distributed on gloo), for tests/test_torch_distributed.py.

    python -m tests.torch_trainer --root ROOT --run mix2 --checkpoint DIR --log FILE --start 30 --save-at 36 --stop 36
    python -m tests.torch_trainer ... --resume --stop 42           # on any number of processes

Rank and world size come from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Each step, the
ranks gather their rows' digests and rank 0 logs the global batch's hash (``trainer_client.digest``), the loss
and a checksum of the model's parameters, one JSON line per step. The model (a token embedding and an output
layer, DDP), its Adam state and the data state (``RunIterableDataset``, which is ``Stateful``) are saved together
by ``torch.distributed.checkpoint``, and loaded together with ``--resume``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from tests.client_helpers import LENGTHS
from trainer_client.digest import batch_hash, row_digests
from trainer_client.pytorch import IGNORE_INDEX, CacheRun, RunIterableDataset, next_token_labels

VOCAB = 384  # the toy tasks' byte vocabulary


def checksum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--save-at", type=int)
    parser.add_argument("--stop", type=int, required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    dataset = RunIterableDataset(CacheRun(args.root, args.run), LENGTHS, start=args.start)  # this rank's slice

    def write(record: dict) -> None:
        if rank == 0:
            with open(args.log, "a") as log:
                log.write(json.dumps({"processes": world, **record}) + "\n")

    if args.resume:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "data": dataset}
        dcp.load(state, checkpoint_id=args.checkpoint)  # calls dataset.load_state_dict with the saved data state
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        write({"event": "restored", "data": dataset.state_dict(), "checksum": checksum(model)})

    for element in dataset:
        step = int(element["step"])
        if step >= args.stop:
            break
        digests = row_digests({name: element[name].numpy() for name in LENGTHS})
        gathered: list[np.ndarray | None] = [None] * world
        dist.all_gather_object(gathered, digests)  # rank order is row order
        tokens = element["targets"].long()
        labels = torch.from_numpy(next_token_labels(element["targets"].numpy()))
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        write({"step": step, "hash": batch_hash(np.concatenate(gathered)), "loss": loss.item()})
        if args.save_at is not None and step + 1 == args.save_at:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optimizer_state, "data": dataset}, checkpoint_id=args.checkpoint)
            write({"event": "saved", "data": dataset.state_dict(), "checksum": checksum(model)})
    dataset.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
