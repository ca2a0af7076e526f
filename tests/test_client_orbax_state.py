"""The data state as an orbax item: saved in the model's orbax step by ``CheckpointManager`` (asynchronous),
restored into an iterator on the same or another number of processes, another run refused."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import orbax.checkpoint as ocp
import pytest

from taskdata.runs import RunStore
from tests.client_helpers import (
    LENGTHS,
    REPO,
    client_env,
    features_equal,
    free_port,
    reference_hashes,
    shared_root,
)
from trainer_client.assignments import HostSlice
from trainer_client.iterator import DataIterator, DataState, ResumeError
from trainer_client.local_source import LocalAssignments
from trainer_client.orbax_state import DataCheckpointHandler, DataCheckpointRestore, DataCheckpointSave


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def iterator(root, run="mix4", **kwargs) -> DataIterator:
    source = LocalAssignments.from_cache_root(RunStore(root).get(run), root)
    return DataIterator(source, LENGTHS, host_slice=HostSlice(1, 2), **kwargs)


def manager(path) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(str(path), options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True))


@pytest.mark.slow
def test_the_data_state_is_saved_in_the_same_orbax_step_as_the_model_state(root, tmp_path):
    params = {"w": jax.numpy.arange(6.0)}
    with iterator(root) as it, manager(tmp_path) as mngr:
        for _ in range(3):
            next(it)
        mngr.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(params), data=DataCheckpointSave(it)))
        next(it)  # the state saved is the one at the save call, not when the arrays are written
        mngr.wait_until_finished()
        assert mngr.all_steps() == [3]
        fingerprint = it.info.fingerprint
    text = (tmp_path / "3" / "data" / "process_0-of-1.json").read_text()
    assert json.loads(text) == {"fingerprint": fingerprint, "step": 3} and len(text.encode()) < 1024


@pytest.mark.slow
def test_restoring_moves_a_fresh_iterator_to_the_saved_step(root, tmp_path):
    with iterator(root) as it, manager(tmp_path) as mngr:
        uninterrupted = [next(it) for _ in range(8)]
        mngr.save(5, args=ocp.args.Composite(data=DataCheckpointSave(DataState(5, it.info.fingerprint))))
        mngr.wait_until_finished()
    with iterator(root) as fresh, manager(tmp_path) as mngr:
        next(fresh)  # it already read ahead from step 0: the restore drops that
        restored = mngr.restore(5, args=ocp.args.Composite(data=DataCheckpointRestore(fresh)))
        assert restored["data"] is fresh and fresh.state().step == 5
        tail = [next(fresh) for _ in range(3)]
    assert [b.step for b in tail] == [5, 6, 7]
    assert all(features_equal(a.features, b.features) for a, b in zip(tail, uninterrupted[5:], strict=True))
    with manager(tmp_path) as mngr:
        assert mngr.restore(5, args=ocp.args.Composite(data=DataCheckpointRestore()))["data"].step == 5


@pytest.mark.slow
def test_a_state_of_another_run_is_refused_with_the_iterators_error_and_changes_nothing(root, tmp_path):
    with iterator(root) as it, manager(tmp_path) as mngr:
        next(it), next(it)
        mngr.save(2, args=ocp.args.Composite(data=DataCheckpointSave(it)))
        mngr.wait_until_finished()
    with iterator(root, "other_seed") as other, manager(tmp_path) as mngr:
        with pytest.raises(ResumeError, match=r"belongs to a run with fingerprint .* but run 'other_seed' has"):
            mngr.restore(2, args=ocp.args.Composite(data=DataCheckpointRestore(other)))
        assert next(other).step == 0


def test_another_process_count_restores_only_a_state_all_processes_agreed_on(tmp_path):
    handler = DataCheckpointHandler()
    for index in range(2):
        (tmp_path / f"process_{index}-of-2.json").write_text(json.dumps({"fingerprint": "a" * 64, "step": 9}))
    assert handler.restore(tmp_path) == DataState(9, "a" * 64)  # this process is 0 of 1
    (tmp_path / "process_1-of-2.json").write_text(json.dumps({"fingerprint": "a" * 64, "step": 8}))
    with pytest.raises(ResumeError, match="were at different data states"):
        handler.restore(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResumeError, match="holds no data state"):
        handler.restore(tmp_path / "empty")


def test_what_cannot_be_a_data_state_is_refused(tmp_path):
    handler = DataCheckpointHandler()
    with pytest.raises(TypeError, match="takes a DataIterator, a DataState or a Grain iterator"):
        handler.save(tmp_path, DataCheckpointSave({"step": 3}))
    with pytest.raises(ResumeError, match="at most 1024 bytes of JSON"):
        handler.save(tmp_path, DataCheckpointSave(DataState(3, "f" * 2000)))


def run_workers(ckpt, root, until: int, processes: int) -> list[dict]:
    port = str(free_port())
    command = [sys.executable, "-m", "tests.orbax_worker", str(ckpt), root, "mix4", str(until), str(processes)]
    workers = [
        subprocess.Popen(
            [*command, str(i), port],
            cwd=REPO,
            env=client_env(2),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    try:
        outputs = [w.communicate(timeout=240) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    for w, (_, err) in zip(workers, outputs, strict=True):
        assert w.returncode == 0, err[-3000:]
    # gloo prints its own lines on stdout too
    return [json.loads(line) for line in outputs[0][0].splitlines() if line.startswith('{"')]


@pytest.mark.slow
def test_a_state_saved_on_two_processes_resumes_on_one_and_back_on_two_with_the_same_batches(root, tmp_path):
    """jax.distributed processes (2 CPU devices each): 2 processes train to step 4 and save, 1 resumes to step 9
    and saves, 2 resume to step 13. Every step's global batch hash equals one process's uninterrupted run."""
    logs = [
        run_workers(tmp_path / "ckpt", root, 4, 2),
        run_workers(tmp_path / "ckpt", root, 9, 1),
        run_workers(tmp_path / "ckpt", root, 13, 2),
    ]
    assert [log[0] for log in logs] == [
        {"start": 0, "processes": 2},
        {"start": 4, "processes": 1},
        {"start": 9, "processes": 2},
    ]
    hashes = {entry["step"]: entry["hash"] for log in logs for entry in log[1:]}
    assert sorted(hashes) == list(range(13))
    assert hashes == reference_hashes(root, "mix4", range(13))
    other = reference_hashes(root, "other_seed", range(40, 43))
    assert other != reference_hashes(root, "mix4", range(40, 43)), "negative control: another seed differs"
