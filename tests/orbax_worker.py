"""One process of a small JAX job that checkpoints with orbax: ``python -m tests.orbax_worker ARGS``.

    CKPT ROOT RUN UNTIL NPROC PID PORT

Restores the latest step of CKPT if there is one (a sharded array, an optax state and the data state,
``DataCheckpointRestore`` into a fresh ``DataIterator``), reads the run's global batches up to step
UNTIL on a mesh over every process's devices, then saves the step UNTIL. Process 0 prints one JSON line
per step with the global batch's hash and, first, the step it started from.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> None:
    ckpt, root, run, until, nproc, pid, port = argv
    until, nproc, pid = int(until), int(nproc), int(pid)
    import jax

    if nproc > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid, initialization_timeout=60)
    import numpy as np
    import optax
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    from taskdata.runs import RunStore
    from tests.client_helpers import LENGTHS
    from trainer_client.arrays import gather_batch_hash, global_batch, host_slice, make_mesh, replicated
    from trainer_client.iterator import DataIterator
    from trainer_client.local_source import LocalAssignments
    from trainer_client.orbax_state import DataCheckpointRestore, DataCheckpointSave

    mesh = make_mesh(1)
    rows = NamedSharding(mesh, PartitionSpec("data"))
    base = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    tx = optax.adam(0.1)

    def state_at(step: int):
        w = jax.make_array_from_callback(base.shape, rows, lambda i: base[i] + step)
        b = jax.device_put(np.full(2, step, np.float32), replicated(mesh))
        return {"w": w, "b": b, "opt": jax.jit(tx.init, out_shardings=replicated(mesh))({"b": b})}

    manager = ocp.CheckpointManager(ckpt, options=ocp.CheckpointManagerOptions(max_to_keep=3))
    iterator = DataIterator(
        LocalAssignments.from_cache_root(RunStore(root).get(run), root), LENGTHS, host_slice=host_slice(mesh)
    )
    first = manager.latest_step()
    if first is None:
        first = 0
    else:
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state_at(0))
        restored = manager.restore(
            first,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), data=DataCheckpointRestore(iterator)),
        )
        assert restored["data"] is iterator and iterator.state().step == first
        w = np.asarray(multihost_utils.process_allgather(restored["state"]["w"], tiled=True))
        assert np.array_equal(w, base + first), "the sharded array came back as saved"
        assert np.array_equal(np.asarray(restored["state"]["b"]), np.full(2, first, np.float32))
        assert isinstance(restored["state"]["opt"][0], optax.ScaleByAdamState)
    out = [{"start": first, "processes": jax.process_count()}]
    for step in range(first, until):
        batch = next(iterator)
        assert batch.step == step
        out.append({"step": step, "hash": gather_batch_hash(global_batch(batch, mesh))})
    manager.save(until, args=ocp.args.Composite(state=ocp.args.StandardSave(state_at(until)), data=DataCheckpointSave(iterator)))
    manager.wait_until_finished()
    manager.close()
    iterator.close()
    if pid == 0:
        print("\n".join(json.dumps(line) for line in out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
