"""A run in PyTorch trainers (needs torch: ``pip install 'taskdata[torch]'``).

- ``RunMapDataset``: item ``i`` is the example at position ``i`` of the run, for samplers that walk the
  global sample index (Megatron's ``MegatronPretrainingSampler`` from ``consumed_samples``).
- ``RunIterableDataset``: a rank's host batches of consecutive steps, ``Stateful`` (its state is the data
  state, one step of one run), for ``torch.distributed.checkpoint`` and torchdata's ``StatefulDataLoader``.
- ``CacheRun``: opens a run stored under a cache root, in whichever process reads.
- ``next_token_labels``: a row's next-token labels with ``IGNORE_INDEX`` at every example's end.
- ``trainer_client.pytorch.megatron``: Megatron's GPT sample layout (``gpt_sample``) and the iterations it
  skips where the plan skips steps (``iterations_to_skip``).
- ``trainer_client.pytorch.torchtitan`` (needs torchtitan 0.3.0): the data loader torchtitan's trainer builds.
"""

from trainer_client.pytorch.iterable import STEP_KEY, RunBatches, RunIterableDataset
from trainer_client.pytorch.labels import IGNORE_INDEX, next_token_labels
from trainer_client.pytorch.map_dataset import RunMapDataset
from trainer_client.pytorch.source import CacheRun

__all__ = [
    "IGNORE_INDEX",
    "STEP_KEY",
    "CacheRun",
    "RunBatches",
    "RunIterableDataset",
    "RunMapDataset",
    "next_token_labels",
]
