"""Host batches -> global ``jax.Array``s over a named mesh, as in t5x's partitioning.

The mesh has two named axes: ``data`` (batch rows; one slice of the global batch per position) and
``model`` (parameters split across devices). Batches are sharded ``PartitionSpec("data", None)``:
each process holds the rows of the data-axis positions of its devices, so the slice a host reads
(``host_slice``) follows from the mesh, and hosts that hold one model replica read the same slice.
``jax.make_array_from_process_local_data`` then assembles the global array from every host's rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer_client.assignments import HostSlice
from trainer_client.digest import DIGEST_BYTES, batch_hash, row_digests
from trainer_client.reading import ClientBatch

__all__ = [
    "DATA_AXIS",
    "MODEL_AXIS",
    "batch_sharding",
    "gather_batch_hash",
    "global_batch",
    "host_slice",
    "make_mesh",
    "replicated",
]

DATA_AXIS = "data"
MODEL_AXIS = "model"


def make_mesh(model: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, model) mesh over ``devices`` (default: all), each process's devices contiguous."""
    devices = list(jax.devices() if devices is None else devices)
    if isinstance(model, bool) or not isinstance(model, int) or model < 1 or len(devices) % model:
        raise ValueError(
            f"The model axis size must be a positive integer dividing the {len(devices)} devices but got "
            f"{model!r}."
        )
    # Process-major order keeps a process's devices on neighbouring data positions, so each host
    # holds one contiguous slice of every global batch.
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    grid = np.array(ordered, dtype=object).reshape(len(ordered) // model, model)
    return Mesh(grid, (DATA_AXIS, MODEL_AXIS))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS, None))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def host_slice(mesh: Mesh, process_index: int | None = None) -> HostSlice:
    """The slice of every global batch that ``process_index`` (default: this process) must supply to
    ``global_batch`` (rows sharded over the ``data`` axis, replicated over the others). Not for MaxText, which
    shards every batch over all of its mesh axes from each process's own rows: ``trainer_client.maxtext``."""
    process = jax.process_index() if process_index is None else process_index
    grid = mesh.devices
    axis = mesh.axis_names.index(DATA_AXIS)
    mine = sorted({int(i[axis]) for i in np.ndindex(grid.shape) if grid.item(i).process_index == process})
    size = grid.shape[axis]
    if not mine:
        raise ValueError(f"Process {process} has no device in the mesh; every process must hold a slice.")
    span = len(mine)
    if mine != list(range(mine[0], mine[0] + span)) or mine[0] % span or size % span:
        raise ValueError(
            f"Process {process} holds data positions {mine} of {size}: not one aligned contiguous slice. Build "
            "the mesh with make_mesh (process-major device order)."
        )
    return HostSlice(mine[0] // span, size // span)


def global_batch(batch: ClientBatch, mesh: Mesh) -> dict[str, jax.Array]:
    """This host's rows of ``batch`` -> global arrays [global batch, length] sharded over ``data``."""
    sharding = batch_sharding(mesh)
    size = mesh.shape[DATA_AXIS]
    if batch.global_batch_size % size:
        raise ValueError(
            f"Step {batch.step}: a global batch of {batch.global_batch_size} cannot be split over the {size} "
            f"positions of the mesh's data axis. Use a batch size that is a multiple of {size}."
        )
    return {
        name: jax.make_array_from_process_local_data(
            sharding, local, (batch.global_batch_size, *local.shape[1:])
        )
        for name, local in batch.features.items()
    }


def gather_batch_hash(arrays: Mapping[str, jax.Array]) -> str:
    """The ``digest.batch_hash`` of the global batch that ``arrays`` hold, computed from their shards.

    Every process hashes the rows it holds (once, even when model-axis replicas hold them twice), the
    row digests are gathered across processes with their row numbers, and every process gets the hash.
    Only digests cross the network (32 bytes per example), not the batch.
    """
    from jax.experimental import multihost_utils

    names = sorted(arrays)
    first = arrays[names[0]]
    rows_total = first.shape[0]
    local: dict[int, np.ndarray] = {}
    for shard in first.addressable_shards:
        start = shard.index[0].start or 0
        if start in local:
            continue
        stop = shard.index[0].stop if shard.index[0].stop is not None else rows_total
        features = {}
        for name in names:
            piece = next(s for s in arrays[name].addressable_shards if s.device == shard.device)
            features[name] = np.asarray(piece.data)
        digests = row_digests(features)
        if len(digests) != stop - start:
            raise ValueError(f"Shard at rows {start}:{stop} holds {len(digests)} rows.")
        local[start] = digests
    starts = sorted(local)
    row_numbers = np.concatenate([np.arange(s, s + len(local[s])) for s in starts]).astype(np.int64)
    digests = np.concatenate([local[s] for s in starts])
    all_rows = np.asarray(multihost_utils.process_allgather(row_numbers)).reshape(-1)
    all_digests = np.asarray(multihost_utils.process_allgather(digests)).reshape(-1, DIGEST_BYTES)
    full = np.zeros((rows_total, DIGEST_BYTES), dtype=np.uint8)
    seen = np.zeros(rows_total, dtype=bool)
    for row, digest in zip(all_rows.tolist(), all_digests, strict=True):
        if seen[row] and not np.array_equal(full[row], digest):
            raise ValueError(f"Row {row} of the global batch differs between the processes that hold it.")
        full[row], seen[row] = digest, True
    if not seen.all():
        raise ValueError(
            f"Rows {np.flatnonzero(~seen)[:8].tolist()} of the global batch are held by no process."
        )
    return batch_hash(full)
