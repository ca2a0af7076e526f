"""Stored runs that gain stages: run format 3, older records read as before, appends and their rules,
and stores in other processes seeing an append once their refresh interval has passed."""

from __future__ import annotations

import json
import time

import pytest

from taskdata.index import BatchSchedule, Stage
from taskdata.runs import RunError, RunStore, StoredRun
from tests.run_helpers import mix_run, shared_caches

pytestmark = pytest.mark.slow  # cache jobs (Beam)

RATES = {"toy_det": 1, "toy_random": 0, "toy_text": 2}


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    return shared_caches(tmp_path_factory)


def test_a_run_record_of_format_2_loads_as_the_same_plan_with_the_same_fingerprint(caches, tmp_path):
    run = mix_run(caches)
    old = {"format": "taskdata.run/2", "plan": run.plan.to_dict()}  # what the store wrote before stages
    (tmp_path / "_runs").mkdir()
    (tmp_path / "_runs" / "mix.json").write_text(json.dumps(old))
    loaded = RunStore(str(tmp_path)).get("mix")
    assert loaded == run and loaded.plan.fingerprint() == run.plan.fingerprint()
    assert run.to_dict() == {"format": "taskdata.run/4", "plan": old["plan"], "served_before": 0}  # no stages: none
    staged = {"format": "taskdata.run/2", "plan": {**old["plan"], "stages": []}}
    with pytest.raises(RunError, match="'taskdata.run/2' record's plan has no stages"):
        StoredRun.from_dict(staged)


def test_stages_are_appended_in_order_and_only_ahead_of_the_run(caches, tmp_path):
    store = RunStore(str(tmp_path))
    store.create(mix_run(caches))
    run, added = store.add_stage("mix", Stage(100, RATES), current_step=90)
    assert added and run.plan.stages == (Stage(100, RATES),)
    record = json.loads((tmp_path / "_runs" / "mix.json").read_text())
    assert record["format"] == "taskdata.run/4" and record["plan"]["stages"][0]["start"] == 100
    assert RunStore(str(tmp_path)).get("mix") == run
    assert store.add_stage("mix", Stage(100, RATES), current_step=200) == (run, False)  # a retry: unchanged
    with pytest.raises(RunError, match="its current step is 150: .* The earliest step a new stage may start at is 150"):
        store.add_stage("mix", Stage(120, schedule=BatchSchedule.constant(32)), current_step=150)
    with pytest.raises(RunError, match="its last stage starts at step 100, .* may start at is 101"):
        store.add_stage("mix", Stage(100, schedule=BatchSchedule.constant(32)), current_step=0)
    with pytest.raises(RunError, match="There is no stored run 'other'"):
        store.add_stage("other", Stage(100, RATES), current_step=0)
    assert RunStore(str(tmp_path)).get("mix") == run  # nothing refused was written


def test_another_store_sees_an_append_once_its_refresh_interval_has_passed(caches, tmp_path):
    writer = RunStore(str(tmp_path))
    writer.create(mix_run(caches))
    patient, eager = RunStore(str(tmp_path), refresh_seconds=3600), RunStore(str(tmp_path), refresh_seconds=0)
    before = patient.get("mix")
    assert eager.get("mix") is eager.get("mix")  # an unchanged file keeps its object (and its tables)
    after, _ = writer.add_stage("mix", Stage(50, schedule=BatchSchedule.constant(32)), current_step=50)
    assert patient.get("mix") is before and eager.get("mix") == after
    with pytest.raises(RunError, match="refresh_seconds must be a number >= 0"):
        RunStore(str(tmp_path), refresh_seconds=-1)


def test_creating_a_run_again_is_unchanged_even_after_stages_were_appended(caches, tmp_path):
    store = RunStore(str(tmp_path))
    store.create(mix_run(caches))
    store.add_stage("mix", Stage(10, RATES), current_step=10)
    assert store.create(mix_run(caches)) is False
    from taskdata.runs import RunConflictError

    with pytest.raises(RunConflictError, match="already exists with a different plan"):
        store.create(mix_run(caches, seed=8))
    with pytest.raises(RunConflictError):  # the same plan with another first stage is another run
        store.create(mix_run(caches, stages=(Stage(10, {"toy_det": 1, "toy_random": 1, "toy_text": 1}),)))


def test_a_store_with_a_refresh_interval_answers_at_once_and_reads_the_file_in_the_background(caches, tmp_path):
    writer = RunStore(str(tmp_path))
    writer.create(mix_run(caches))
    reader = RunStore(str(tmp_path), refresh_seconds=0.01)
    before = reader.get("mix")
    after, _ = writer.add_stage("mix", Stage(50, schedule=BatchSchedule.constant(32)), current_step=50)
    time.sleep(0.02)
    assert reader.get("mix") is before  # stale: answered from memory, the file is being read
    deadline = time.monotonic() + 10
    while reader.get("mix") != after:
        assert time.monotonic() < deadline, "the background read never brought the appended stage"
        time.sleep(0.01)
    (tmp_path / "_runs" / "mix.json").write_text("{")  # damaged: the next read in the open says so
    deadline = time.monotonic() + 10
    with pytest.raises(RunError, match="is not valid JSON"):
        while time.monotonic() < deadline:
            time.sleep(0.02)
            reader.get("mix")
