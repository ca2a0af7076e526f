"""The example trainer's orbax checkpoints: exact round trip of parameters, optax and data state; commit;
loud failures. (Preemption, SIGKILL and other numbers of processes: ``test_client_train``.)"""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding

from trainer_client.arrays import make_mesh, replicated
from trainer_client.example.batch_log import BatchLog, read_batch_log, read_batch_log_lines
from trainer_client.example.checkpoint import (
    CheckpointError,
    checkpoint_manager,
    committed_steps,
    restore,
    save,
    saved_param_shapes,
)
from trainer_client.example.optimizer import init_opt_state, make_optimizer, opt_state_shardings
from trainer_client.iterator import DataState

FINGERPRINT = "f" * 64
SHAPES = {"w": (3, 4), "b": (4,)}


def _setup():
    mesh = make_mesh(1)
    shardings = {n: NamedSharding(mesh, jax.sharding.PartitionSpec()) for n in SHAPES}
    shapes = {n: jax.ShapeDtypeStruct(s, np.float32) for n, s in SHAPES.items()}
    tx = make_optimizer(0.1)
    return tx, shardings, shapes, opt_state_shardings(tx, shardings, shapes, replicated(mesh))


def train_state(seed: int):
    """Parameters and an Adam state after ``seed`` updates (so its moments and count are not zeros)."""
    tx, shardings, _, o_shardings = _setup()
    rng = np.random.default_rng(seed)
    params = {n: jax.device_put(rng.standard_normal(s).astype(np.float32), shardings[n]) for n, s in SHAPES.items()}
    opt_state = init_opt_state(tx, params, o_shardings)
    for _ in range(seed):
        grads = jax.tree.map(lambda p: p * 0.5 + 1.0, params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return {"params": params, "opt_state": opt_state}


def abstract_state():
    tx, shardings, shapes, o_shardings = _setup()
    return {
        "params": {n: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=shardings[n]) for n, s in shapes.items()},
        "opt_state": jax.tree.map(
            lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
            jax.eval_shape(tx.init, shapes),
            o_shardings,
        ),
    }


def save_steps(directory: str, steps, keep: int = 2) -> None:
    manager = checkpoint_manager(directory, keep)
    for step in steps:
        save(manager, train_state(step), DataState(step, FINGERPRINT))
    manager.close()


@pytest.mark.slow  # seconds
def test_round_trip_restores_parameters_optax_state_and_data_state_exactly(tmp_path):
    save_steps(str(tmp_path), [7])
    manager = checkpoint_manager(str(tmp_path), 2)  # a fresh manager, as a restarted trainer opens it
    state, data = restore(manager, 7, abstract_state())
    manager.close()
    assert data == DataState(7, FINGERPRINT)
    expected = train_state(7)
    assert jax.tree.structure(state) == jax.tree.structure(expected)  # optax's own state types come back
    assert isinstance(state["opt_state"][0], optax.ScaleByAdamState) and int(state["opt_state"][0].count) == 7
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected), strict=True):
        assert got.dtype == want.dtype and np.array_equal(np.asarray(got), np.asarray(want))
    assert saved_param_shapes(checkpoint_manager(str(tmp_path), 2), 7) == SHAPES


def test_the_data_state_is_one_small_json_file_per_process_beside_the_arrays(tmp_path):
    save_steps(str(tmp_path), [3])
    files = sorted(os.listdir(tmp_path / "3" / "data"))
    assert [f for f in files if f.endswith(".json")] == ["process_0-of-1.json"]
    text = (tmp_path / "3" / "data" / "process_0-of-1.json").read_text()
    assert json.loads(text) == {"fingerprint": FINGERPRINT, "step": 3} and len(text) < 1024
    assert os.path.isdir(tmp_path / "3" / "state")


def test_newest_checkpoints_are_kept(tmp_path):
    save_steps(str(tmp_path), [5, 10, 15, 20], keep=2)
    assert committed_steps(str(tmp_path)) == [15, 20]
    assert sorted(os.listdir(tmp_path)) == ["15", "20"]


def test_a_save_killed_before_its_commit_leaves_the_previous_checkpoint(tmp_path):
    save_steps(str(tmp_path), [10])
    # What a kill during the next save leaves: orbax's temporary folder of that step, never committed.
    killed = tmp_path / "20.orbax-checkpoint-tmp"
    shutil.copytree(tmp_path / "10", killed)
    for marker in killed.rglob("commit_success.txt"):
        marker.unlink()
    assert committed_steps(str(tmp_path)) == [10]
    manager = checkpoint_manager(str(tmp_path), 2)  # the restarted trainer
    assert manager.latest_step() == 10
    state, data = restore(manager, 10, abstract_state())
    assert data.step == 10
    save(manager, state, DataState(14, FINGERPRINT))
    manager.close()
    assert sorted(os.listdir(tmp_path)) == ["10", "14"], "the next save removed what the killed one left"


def test_a_data_state_of_another_step_is_an_error_naming_the_checkpoint(tmp_path):
    save_steps(str(tmp_path), [4])
    path = tmp_path / "4" / "data" / "process_0-of-1.json"
    path.write_text(json.dumps({"fingerprint": FINGERPRINT, "step": 5}))
    manager = checkpoint_manager(str(tmp_path), 2)
    with pytest.raises(CheckpointError, match=r"Checkpoint 4 in .* holds the data state of step 5"):
        restore(manager, 4, abstract_state())
    manager.close()


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep must be an integer >= 1 but got 0"):
        checkpoint_manager(str(tmp_path), 0)


def test_no_checkpoint_is_an_empty_list(tmp_path):
    assert committed_steps(str(tmp_path / "missing")) == []


def test_batch_log_drops_a_torn_last_line_and_keeps_the_last_entry_per_step(tmp_path):
    path = str(tmp_path / "log.jsonl")
    log = BatchLog(path)
    for step in range(3):
        log.write({"step": step, "hash": f"h{step}"})
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"hash": "h3", "st')  # a kill mid-write
    assert [e["step"] for e in read_batch_log_lines(path)] == [0, 1, 2]
    log = BatchLog(path)  # a restart from the checkpoint of step 1 trains steps 1, 2, 3 again
    for step in (1, 2, 3):
        log.write({"step": step, "hash": f"h{step}'"})
    log.close()
    assert [e["step"] for e in read_batch_log_lines(path)] == [0, 1, 2, 1, 2, 3]
    assert {s: e["hash"] for s, e in read_batch_log(path).items()} == {0: "h0", 1: "h1'", 2: "h2'", 3: "h3'"}
