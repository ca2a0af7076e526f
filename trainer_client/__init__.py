"""The JAX trainer client: assignments -> verified records -> host batches -> global ``jax.Array``s.

Data path (no JAX needed): ``ServerAssignments`` / ``LocalAssignments`` -> ``DataIterator`` ->
``ClientBatch``. JAX side: ``make_mesh``, ``host_slice``, ``global_batch``, ``gather_batch_hash``.
The example trainer is ``python -m trainer_client.example.train``.

In the stacks trainers use (imported from their modules, which need those libraries): the data state
as an orbax checkpoint item (``trainer_client.orbax_state``), a run as a ``tf.data.Dataset``
(``trainer_client.tfdata``) or a Grain dataset (``trainer_client.grain_dataset``), a model's features
from host batches as seqio's feature converters make them (``trainer_client.features``, numpy only),
t5x's dataset function over a run (``trainer_client.t5x_dataset``), and the watchdog that ends every
process of a ``jax.distributed`` job when one stops (``trainer_client.peers``).
"""

from trainer_client.assignments import (
    AssignmentError,
    AssignmentSource,
    HostSlice,
    RunInfo,
    StepReads,
    TaskReads,
)
from trainer_client.digest import batch_hash, row_digests
from trainer_client.iterator import DataIterator, DataState, ResumeError
from trainer_client.local_source import LocalAssignments
from trainer_client.reading import BatchReader, ClientBatch
from trainer_client.server_source import ServerAssignments

__all__ = [
    "AssignmentError",
    "AssignmentSource",
    "BatchReader",
    "ClientBatch",
    "DataIterator",
    "DataState",
    "HostSlice",
    "LocalAssignments",
    "ResumeError",
    "RunInfo",
    "ServerAssignments",
    "StepReads",
    "TaskReads",
    "batch_hash",
    "row_digests",
]
