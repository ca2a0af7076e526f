"""t5x's own train.py on a taskdata run: a tiny T5 (t5x's tiny.gin) trained on CPU by two processes whose
model is split across both (one data shard, so t5x's Orbax checkpointer restores the dataset on process 0
only), killed after a checkpoint and restarted; every batch both processes trained, hashed as they trained
it, is the run's batch for that step, as an uninterrupted reading gives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from taskdata.runs import RunStore
from tests.client_helpers import LENGTHS, REPO, client_env, free_port, shared_root
from tests.t5x_helpers import import_t5x
from trainer_client.assignments import HostSlice
from trainer_client.digest import batch_hash, row_digests
from trainer_client.features import EncDecFeatures
from trainer_client.iterator import DataIterator
from trainer_client.local_source import LocalAssignments

pytestmark = pytest.mark.slow

t5x = import_t5x()

START = 40  # the run's step 0 here is data step 40: past the first epoch, where the seed decides the order
GIN = """
from __gin__ import dynamic_registration

import __main__ as train_script
import seqio
from t5x import partitioning
from t5x import utils
from t5x.examples.t5 import network
from trainer_client import t5x_dataset

include 't5x/examples/t5/t5_1_1/tiny.gin'
include 't5x/configs/runs/pretrain.gin'

MIXTURE_OR_TASK_NAME = "toy_mix"
TASK_FEATURE_LENGTHS = {"inputs": 8, "targets": 176}
BATCH_SIZE = 16
DROPOUT_RATE = 0.0
RANDOM_SEED = 0
VOCABULARY = @seqio.ByteVocabulary()
network.T5Config.vocab_size = 384
network.T5Config.dtype = 'float32'
network.T5Config.num_encoder_layers = 1  # tinier still: compiling is most of this test's time
network.T5Config.num_decoder_layers = 1

train_script.train:
  get_dataset_fn = @t5x_dataset.get_dataset
  train_eval_dataset_cfg = None
  verify_matching_vocabs_fn = None
  eval_period = 0
t5x_dataset.get_dataset:
  run = "mix1"
  model_dir = %MODEL_DIR
train/utils.DatasetConfig.pack = False
utils.SaveCheckpointConfig:
  period = 5
  save_dataset = True

# The model split across the two processes' CPUs: one data shard, read by both.
partitioning.PjitPartitioner.num_partitions = None
partitioning.PjitPartitioner.model_parallel_submesh = (2, 1)
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def reference(root, run, steps):
    """The hash of every step's model features, one process reading the run without t5x."""
    source = LocalAssignments.from_cache_root(RunStore(root).get(run), root)
    with DataIterator(source, LENGTHS, start=min(steps), host_slice=HostSlice(0, 1), stop_step=max(steps) + 1) as it:
        return {b.step: batch_hash(row_digests(EncDecFeatures()(b.features))) for b in it}


def start(tmp_path, root, name, steps):
    """train.py in two processes (jax.distributed on 127.0.0.1); returns them and their log paths."""
    (tmp_path / "taskdata_tiny.gin").write_text(GIN)
    env = client_env(1)
    env.update(TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK="true", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax"))
    port = free_port()
    processes, logs = [], []
    for index in range(2):
        log = tmp_path / f"{name}_{index}.log"
        with open(log, "wb") as err:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "t5x.train",
                 f"--gin_search_paths={os.path.dirname(os.path.dirname(t5x.__file__))},{tmp_path}",
                 "--gin_file=taskdata_tiny.gin",
                 f"--gin.MODEL_DIR='{tmp_path / 'model'}'",
                 f"--gin.TRAIN_STEPS={steps}",
                 f"--gin.t5x_dataset.get_dataset.cache_root='{root}'",
                 f"--gin.t5x_dataset.get_dataset.start_step={START}",
                 f"--gin.t5x_dataset.get_dataset.batch_log='{tmp_path / 'batches' / name}'",
                 "--multiprocess_gpu", f"--coordinator_address=127.0.0.1:{port}", "--process_count=2",
                 f"--process_index={index}"],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err))
        logs.append(log)
    return processes, logs


def stop(processes):
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def tail(logs):
    return "".join(f"\n--- {log}:\n" + log.read_text(errors="replace")[-3000:] for log in logs)


def logged(tmp_path, name, index):
    path = tmp_path / "batches" / name / f"process_{index}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_py_killed_after_a_checkpoint_and_restarted_trains_the_run_s_batches(root, tmp_path):
    model = tmp_path / "model"
    processes, logs = start(tmp_path, root, "first", steps=1000)
    try:
        deadline = time.monotonic() + 480
        while not (model / "checkpoint_5").is_dir():  # Orbax renames a checkpoint's folder once it is complete
            assert all(p.poll() is None for p in processes), f"train.py stopped{tail(logs)}"
            assert time.monotonic() < deadline, f"no checkpoint 5 within 480 s{tail(logs)}"
            time.sleep(0.1)
    finally:
        stop(processes)
    saved = json.loads((model / "checkpoint_5" / "dataset" / "process_0-of-2" / "train_ds-000-of-001").read_text())
    assert saved["step"] == START + 5
    assert not (model / "checkpoint_5" / "dataset" / "process_1-of-2").exists()  # process 1 saves none

    processes, logs = start(tmp_path, root, "restarted", steps=12)
    try:
        for process in processes:
            assert process.wait(timeout=480) == 0, f"train.py failed{tail(logs)}"
    finally:
        stop(processes)
    text = [log.read_text(errors="replace") for log in logs]
    # Both start at the saved step before any restore; t5x then restores the data state on process 0 alone.
    assert all(f"data shard 0 of 1 from step {START + 5}," in t for t in text)
    assert f"restored data state step {START + 5}" in text[0]
    assert "restored data state" not in text[1]

    first = [logged(tmp_path, "first", index) for index in range(2)]
    restarted = [logged(tmp_path, "restarted", index) for index in range(2)]
    trained = first[0] + first[1] + restarted[0] + restarted[1]
    expected = reference(root, "mix1", range(START, max(line["step"] for line in trained) + 1))
    # Killed, the processes had each taken batches up to where they stopped (JAX dispatches steps ahead).
    shorter = min(len(first[0]), len(first[1]))
    assert shorter >= 5 and first[0][:shorter] == first[1][:shorter]  # at least the checkpoint's 5 batches
    assert [line["step"] for line in first[1]] == list(range(START, START + len(first[1])))
    assert restarted[0] == restarted[1]  # the same rows on both processes of the replica set
    assert [line["step"] for line in restarted[0]] == list(range(START + 5, START + 12))
    assert all(line["hash"] == expected[line["step"]] for line in trained)
    # Negative control: the same steps of the run with another seed are other batches.
    other = reference(root, "other_seed", range(START + 5, START + 12))
    assert not any(line["hash"] == other[line["step"]] for line in logged(tmp_path, "restarted", 0))
