"""Global arrays over a (data, model) mesh of 4 simulated devices, their hash, and a sharded train step."""

from __future__ import annotations

import os

FORCE = "--xla_force_host_platform_device_count=4"
# Must be set before JAX creates its CPU backend (test modules that use JAX create none at import).
if FORCE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FORCE).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from taskdata.runs import RunStore  # noqa: E402
from tests.client_helpers import LENGTHS, shared_root  # noqa: E402
from trainer_client.arrays import (  # noqa: E402
    batch_sharding,
    gather_batch_hash,
    global_batch,
    host_slice,
    make_mesh,
    replicated,
)
from trainer_client.assignments import HostSlice  # noqa: E402
from trainer_client.digest import batch_hash, row_digests  # noqa: E402
from trainer_client.example.model import ModelConfig, init_params, loss_fn, param_shapes, param_specs  # noqa: E402
from trainer_client.example.optimizer import init_opt_state, make_optimizer, opt_state_shardings  # noqa: E402
from trainer_client.local_source import LocalAssignments  # noqa: E402
from trainer_client.reading import BatchReader  # noqa: E402

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    root = shared_root(tmp_path_factory)
    source = LocalAssignments.from_cache_root(RunStore(root).get("mix4"), root)
    reader = BatchReader(source.run_info(), LENGTHS)
    out = [reader.read(s) for s in source.fetch(0, 3, HostSlice(0, 1))]
    reader.close()
    source.close()
    return out


def test_four_simulated_devices():
    assert jax.device_count() == 4, f"XLA_FLAGS={os.environ.get('XLA_FLAGS')!r} did not take effect"


@pytest.mark.parametrize("model", [1, 2, 4])
def test_global_batch_is_sharded_over_data_and_replicated_over_model(batches, model):
    mesh = make_mesh(model)
    assert dict(mesh.shape) == {"data": 4 // model, "model": model}
    assert host_slice(mesh) == HostSlice(0, 1)  # one process holds every row
    arrays = global_batch(batches[0], mesh)
    rows = 16 // (4 // model)
    for name, array in arrays.items():
        assert array.shape == (16, LENGTHS[name]) and array.dtype == np.int32
        assert array.sharding == batch_sharding(mesh)
        assert np.array_equal(np.asarray(array), batches[0].features[name])
        starts = sorted(shard.index[0].start or 0 for shard in array.addressable_shards)
        assert starts == sorted([i * rows for i in range(4 // model)] * model)


@pytest.mark.parametrize("model", [1, 2])
def test_batch_hash_from_the_shards_equals_the_host_side_hash(batches, model):
    mesh = make_mesh(model)
    for batch in batches:
        assert gather_batch_hash(global_batch(batch, mesh)) == batch_hash(row_digests(batch.features))
    assert gather_batch_hash(global_batch(batches[0], mesh)) != gather_batch_hash(
        global_batch(batches[1], mesh)
    )


def test_mesh_and_model_errors_name_the_fix(batches):
    with pytest.raises(
        ValueError, match="model axis size must be a positive integer dividing the 4 devices but got 3"
    ):
        make_mesh(3)
    with pytest.raises(
        ValueError, match=r"d_ff \(6\) must be a multiple of the mesh's model axis size \(4\)"
    ):
        ModelConfig(vocab_size=512, num_heads=4, d_ff=6).check_model_axis(4)
    odd = type(batches[0])(0, False, 6, range(0, 6), {k: v[:6] for k, v in batches[0].features.items()})
    with pytest.raises(ValueError, match="a global batch of 6 cannot be split over the 4 positions"):
        global_batch(odd, make_mesh(1))


def _train(batch, model, steps=10):
    import optax

    mesh = make_mesh(model)
    config = ModelConfig(vocab_size=512, d_model=16, num_heads=2, head_dim=8, d_ff=32)
    p_specs = param_specs(config)
    p_sh = {n: NamedSharding(mesh, s) for n, s in p_specs.items()}
    tx = make_optimizer(1e-2)
    shapes = {n: jax.ShapeDtypeStruct(s, np.float32) for n, s in param_shapes(config).items()}
    o_sh = opt_state_shardings(tx, p_sh, shapes, replicated(mesh))
    params = {n: jax.device_put(v, p_sh[n]) for n, v in init_params(config, 0).items()}
    opt = init_opt_state(tx, params, o_sh)
    assert opt[0].mu["decoder.mlp.wi"].sharding == p_sh["decoder.mlp.wi"]
    assert opt[0].count.sharding == replicated(mesh)

    def step(params, opt, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, config)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    step_fn = jax.jit(
        step,
        in_shardings=(p_sh, o_sh, {n: batch_sharding(mesh) for n in LENGTHS}),
        out_shardings=(p_sh, o_sh, replicated(mesh)),
    )
    arrays = global_batch(batch, mesh)
    losses = []
    for _ in range(steps):
        params, opt, loss = step_fn(params, opt, arrays)
        losses.append(float(loss))
    assert params["decoder.mlp.wi"].sharding.spec == p_specs["decoder.mlp.wi"]
    return losses


@pytest.mark.slow
def test_the_sharded_train_step_learns_and_agrees_across_model_axis_sizes(batches):
    # The first 32 target tokens keep the compute small; it is still the real batch.
    short = type(batches[0])(0, False, 16, range(16), {k: v[:, :32] for k, v in batches[0].features.items()})
    losses = _train(short, 1)
    assert losses[-1] < 0.8 * losses[0], losses
    assert np.allclose(_train(short, 2), losses, rtol=1e-4)
