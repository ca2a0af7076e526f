"""Stages and the trainer client: a checkpoint resumes after a stage appended at or after its step (and
never after a change to the steps it trained), and a trainer reading from the server goes on under a
stage appended ahead of it, with the batches a fresh run of the new plan gives."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil

import httpx
import numpy as np
import pytest

from taskdata.index import BatchSchedule, Stage
from taskdata.runs import RunStore, StoredRun
from tests.client_helpers import GLOBAL_BATCH, LENGTHS, features_equal, serve, shared_root
from trainer_client.assignments import AssignmentError, HostSlice
from trainer_client.iterator import DataIterator, DataState, ResumeError
from trainer_client.local_source import LocalAssignments
from trainer_client.server_source import ServerAssignments

pytestmark = pytest.mark.slow  # cache jobs (Beam)

RATES = {"toy_det": 1, "toy_random": 0}


@pytest.fixture
def root(tmp_path_factory, tmp_path):
    """A copy of the shared client root (which must not change), with run 'live' = mix4 under a new name."""
    copy = tmp_path / "root"
    shutil.copytree(shared_root(tmp_path_factory), copy)
    store = RunStore(str(copy))
    store.create(StoredRun(dataclasses.replace(store.get("mix4").plan, name="live")))
    return str(copy)


def local(root, plan=None):
    run = RunStore(root).get("live") if plan is None else StoredRun(plan)
    return LocalAssignments.from_cache_root(run, root)


def batches(source, start=0, stop=20, **kwargs):
    with DataIterator(source, LENGTHS, start=start, host_slice=HostSlice(1, 2), stop_step=stop, **kwargs) as it:
        out = [(b.step, b.features) for b in it]
        return out, it.state()


def same(a, b):
    return [s for s, _ in a] == [s for s, _ in b] and all(
        features_equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True)
    )


def test_a_checkpoint_resumes_after_a_stage_appended_at_or_after_its_step(root):
    store = RunStore(root)
    old = store.get("live").plan
    trained, state = batches(local(root), stop=6)
    assert state == DataState(6, old.fingerprint())
    new, _ = store.add_stage("live", Stage(8, RATES, BatchSchedule.constant(8)), current_step=6)
    assert new.plan.fingerprint() != old.fingerprint() and new.plan.fingerprint_before(6) == state.fingerprint
    resumed, after = batches(local(root), start=state, stop=14)
    fresh, _ = batches(local(root), stop=14)
    assert same(trained + resumed, fresh)  # the checkpointed run is a run of the new plan from step 0
    assert same(resumed[:2], batches(local(root, old), start=6, stop=8)[0])  # steps 6, 7: as before
    assert not same(resumed[2:], batches(local(root, old), start=8, stop=14)[0])  # from step 8: the stage
    assert after == DataState(14, new.plan.fingerprint())
    # A checkpoint taken after the stage started under the old plan trained other data: refused.
    _, late = batches(local(root, old), start=DataState(6, old.fingerprint()), stop=10)
    with pytest.raises(ResumeError, match="steps before the checkpoint's step 10"):
        batches(local(root), start=late, stop=12)



def test_restore_checks_the_state_against_the_steps_before_it_as_a_resume_does(root):
    store = RunStore(root)
    old = store.get("live").plan
    _, state = batches(local(root), stop=6)
    new, _ = store.add_stage("live", Stage(8, RATES, BatchSchedule.constant(8)), current_step=6)
    with DataIterator(local(root), LENGTHS, start=0, host_slice=HostSlice(1, 2), stop_step=10) as it:
        it.restore(state)  # taken before the stage: its steps are the new plan's too
        resumed = [(b.step, b.features) for b in it]
        assert same(resumed, batches(local(root), start=state, stop=10)[0])
        assert it.state() == DataState(10, new.plan.fingerprint())
        late = DataState(10, old.fingerprint())  # steps 8 and 9 trained under the plan without the stage
        with pytest.raises(ResumeError, match="steps before the checkpoint's step 10"):
            it.restore(late)
        assert it.state() == DataState(10, new.plan.fingerprint())  # left as it was

def test_a_checkpoint_never_resumes_after_a_change_to_the_steps_it_trained(root):
    old = RunStore(root).get("live").plan
    _, state = batches(local(root), stop=6)
    changed = dataclasses.replace(old, stages=(Stage(5, RATES),))  # what the store refuses to append
    with pytest.raises(ResumeError, match=f"fingerprint {state.fingerprint}, but run 'live' has fingerprint"):
        batches(local(root, changed), start=state, stop=8)
    later = dataclasses.replace(old, stages=(Stage(6, RATES),))  # starts at the checkpoint's step: fine
    assert batches(local(root, later), start=state, stop=8)[1].step == 8


def test_a_trainer_goes_on_under_a_stage_appended_ahead_of_it(root):
    # The server reserves 2 steps past each request beyond its reservation: a stage may start close ahead.
    with serve(root, run_refresh_seconds=0, run_reserve_steps=2) as url:
        source = ServerAssignments(url, "live")
        with DataIterator(source, LENGTHS, host_slice=HostSlice(1, 2), lookahead=2, prefetch=1, stop_step=40) as it:
            seen = [(b.step, b.features) for _, b in zip(range(5), it, strict=False)]
            start = 5 + 12  # past anything the trainer has fetched (it holds a few lookahead windows)
            response = httpx.post(
                f"{url}/runs/live/stages",
                json={"start": start, "rates": RATES, "batch": {"start": 8}, "current_step": start},
            )
            assert response.status_code == 201, response.text
            seen += [(b.step, b.features) for b in it]
            assert it.info.plan.stages and it.info.plan.stages[0].start == start
            assert it.state() == DataState(40, it.info.plan.fingerprint())
    fresh, _ = batches(local(root), stop=40)  # the new plan, from step 0, with no server
    assert same(seen, fresh)
    assert all(len(features["targets"]) == 4 for step, features in seen if step >= start)  # 8 over 2 hosts


def test_a_trainer_refuses_a_plan_changed_under_steps_it_was_handed(root):
    with serve(root, run_refresh_seconds=0) as url:
        it = DataIterator(ServerAssignments(url, "live"), LENGTHS, host_slice=HostSlice(0, 2), lookahead=2,
                          prefetch=1, stop_step=60)
        with it:
            for _, _ in zip(range(8), it, strict=False):
                pass
            # Written behind the store's back: a stage at step 3, which the trainer has trained already.
            path = pathlib.Path(RunStore(root).path("live"))
            record = json.loads(path.read_text())
            record["plan"]["stages"] = [
                {"start": 3, "rates": {"toy_det": "1", "toy_random": "0"}, "schedule": None}
            ]
            # Atomically, as the store writes: the server re-reads the file on every request (refresh 0 s).
            staged = path.with_name(path.name + ".tmp")
            staged.write_text(json.dumps(record))
            os.replace(staged, path)
            with pytest.raises(AssignmentError, match="changes steps before step"):
                for _ in it:
                    pass



def tf_elements(dataset):
    return [(int(e.pop("step")), e) for e in dataset.as_numpy_iterator()]


def test_a_tf_dataset_across_stages_is_the_iterators_batches_with_rows_static_only_where_fixed(root):
    from trainer_client.tfdata import tf_dataset

    old = RunStore(root).get("live").plan
    resized = dataclasses.replace(old, stages=(Stage(4, RATES, BatchSchedule.constant(8)),))
    reweighted = dataclasses.replace(old, stages=(Stage(4, RATES),))
    cases = [(resized, 0, None), (resized, 6, 4), (reweighted, 0, GLOBAL_BATCH // 2)]
    for plan, start, rows in cases:
        state = DataState(start, plan.fingerprint_before(start))
        dataset = tf_dataset(local(root, plan), LENGTHS, start=state, host_slice=HostSlice(1, 2), stop_step=10)
        assert dataset.element_spec["inputs"].shape.as_list() == [rows, LENGTHS["inputs"]]
        assert same(tf_elements(dataset), batches(local(root, plan), start=state, stop=10)[0])
    # Negative control: the stage changes what the steps from 4 on read.
    assert not same(batches(local(root, resized), start=4, stop=6)[0], batches(local(root, old), start=4, stop=6)[0])


def test_a_tf_dataset_built_with_static_rows_names_a_stage_appended_since_that_changes_them(root):
    import tensorflow as tf

    from trainer_client.tfdata import tf_dataset

    with serve(root, run_refresh_seconds=0, run_reserve_steps=2) as url:
        dataset = tf_dataset(ServerAssignments(url, "live"), LENGTHS, host_slice=HostSlice(1, 2), lookahead=2,
                             prefetch=1, stop_step=40)
        assert dataset.element_spec["inputs"].shape[0] == GLOBAL_BATCH // 2
        response = httpx.post(f"{url}/runs/live/stages",
                              json={"start": 20, "batch": {"start": 8}, "current_step": 20})
        assert response.status_code == 201, response.text
        with pytest.raises(tf.errors.OpError, match=r"Step 20 has 4 examples per host but this dataset was built "
                           r"with \d+ per element .*a stage appended since changes it"):
            tf_elements(dataset)


# --- the example trainer, as separate processes ---------------------------------------------------


def ledger_hashes(root, plan, steps) -> dict[int, str]:
    """The hash of each step's global batch computed from the ledger's records alone: read, decode, pad."""
    from taskdata.runs import open_views, step_ledger
    from trainer_client.digest import batch_hash, row_digests

    views = open_views(plan, root)
    out = {}
    try:
        for step in steps:
            entries = step_ledger(plan, views, step).entries
            rows = {name: np.zeros((len(entries), length), np.int32) for name, length in LENGTHS.items()}
            for i, e in enumerate(entries):
                reader = views[e.task].reader
                decoded = reader.decode(reader.read_records(plan.split, [e.shard], [e.record]),
                                        dict.fromkeys(LENGTHS, "int32"))
                for name in LENGTHS:
                    values = decoded[name].values
                    rows[name][i, : len(values)] = values
            out[step] = batch_hash(row_digests(rows))
    finally:
        for view in views.values():
            view.close()
    return out


@pytest.mark.slow
def test_the_trainers_batch_log_is_the_ledger_and_a_checkpoint_resumes_across_an_appended_stage(
    root, tmp_path_factory, tmp_path
):
    from tests.client_helpers import MODEL_ARGS, Trainer, shared_compilation_cache, trainers
    from trainer_client.example.batch_log import read_batch_log

    store = RunStore(root)
    old = store.get("live").plan
    args = [
        "--cache-root", root, "--run", "live", "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--checkpoint-every", "3", "--log", str(tmp_path / "log.jsonl"), "--inputs-length", "8",
        "--targets-length", "176", "--compilation-cache", shared_compilation_cache(tmp_path_factory), *MODEL_ARGS,
    ]  # fmt: skip
    with trainers([Trainer([*args, "--steps", "6"], stderr_path=str(tmp_path / "err"))]) as (first,):
        first.check(180)
    # Appended while the run is stopped at its step-6 checkpoint: from step 9, only toy_det, 8 a step.
    new, _ = store.add_stage("live", Stage(9, RATES, BatchSchedule.constant(8)), current_step=6)
    with trainers([Trainer([*args, "--steps", "14"], stderr_path=str(tmp_path / "err"))]) as (second,):
        second.check(180)
    log = read_batch_log(str(tmp_path / "log.jsonl"))
    assert sorted(log) == list(range(14))
    assert [log[s]["examples"] for s in range(14)] == [new.plan.batch_size(s) for s in range(14)]
    expected = ledger_hashes(root, new.plan, range(14))
    assert {s: entry["hash"] for s, entry in log.items()} == expected
    # Negative control: without the stage, the ledger says other batches from step 9 on.
    before = ledger_hashes(root, old, range(14))
    assert all(before[s] == expected[s] for s in range(9)) and all(before[s] != expected[s] for s in range(9, 14))
