"""Run records changed by several writers at once: every acknowledged create, stage and reservation is stored.

The first test is the report of issue 37 as a user meets it: two ``taskdata plan --add-stage`` at the same
moment, one at step 100 and one at step 200, both told they succeeded while the record kept one stage. The
others pin what a loser is told (re-applied on top, or refused naming the winner's change) and the run's
``served_before``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from deploy.fault_drills.shared_state import synthetic_run
from taskdata.index import BatchSchedule, Stage
from taskdata.runs import RunChangedError, RunConflictError, RunError, RunStore, StoredRun

REPO = Path(__file__).resolve().parent.parent

# One CLI process that runs 'taskdata plan' (its main(), as the console script does) each time it is told to
# go, so that two of them start an append within a millisecond of each other; prints the exit code and stderr.
_PLAN_ON_GO = """
import contextlib, io, json, sys
from taskdata.cli import main
print("READY", flush=True)
for line in sys.stdin:
    argv = json.loads(line)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    print(json.dumps([code, err.getvalue()]), flush=True)
"""


@pytest.mark.slow
def test_two_plan_add_stage_commands_at_once_never_lose_an_acknowledged_stage(tmp_path):
    root = str(tmp_path)
    store = RunStore(root)
    processes = [subprocess.Popen([sys.executable, "-c", _PLAN_ON_GO], cwd=REPO, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "READY"
        outcomes = []
        for trial in range(30):
            name = f"r{trial}"
            store.create(synthetic_run(name))
            for process, step, batch in zip(processes, (100, 200), (32, 48), strict=True):
                argv = ["plan", "--name", name, "--cache-root", root, "--add-stage", f"{step}:batch={batch}",
                        "--current-step", "50"]
                assert process.stdin is not None
                process.stdin.write(json.dumps(argv) + "\n")
                process.stdin.flush()
            told = [json.loads(p.stdout.readline()) for p in processes]  # type: ignore[union-attr]
            stored = [s.start for s in RunStore(root, refresh_seconds=0).get(name).plan.stages]
            outcomes.append((told, stored))
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=30)
    for (first, second), stored in outcomes:
        for (code, err), step in ((first, 100), (second, 200)):
            if code == 0:
                assert step in stored, f"stage {step} acknowledged (exit 0) but the run holds {stored}"
            else:
                # Only the stage at 100 can be refused: after 200 it no longer follows the last stage.
                assert (code, step, stored) == (2, 100, [200]), (code, err, stored)
                # The winner's stage is named: as a change since this writer's read, or as what it read.
                assert ("another writer appended stage(s) starting at step 200" in err
                        or "its last stage starts at step 200" in err), err
    assert {tuple(stored) for _, stored in outcomes} <= {(100, 200), (200,)}


def test_a_writer_that_lost_the_race_applies_its_stage_on_top_or_is_refused_naming_the_winner(tmp_path):
    mine, theirs = RunStore(str(tmp_path)), RunStore(str(tmp_path))
    mine.create(synthetic_run())
    seen = mine.get("drill_stages")
    theirs.add_stage("drill_stages", Stage(200, schedule=BatchSchedule.constant(32)), current_step=50)
    # Still valid on top of the winner's stage: appended after it.
    run, added = mine.add_stage("drill_stages", Stage(300, schedule=BatchSchedule.constant(48)), current_step=50)
    assert added and [s.start for s in run.plan.stages] == [200, 300]
    assert run.plan.fingerprint_before(200) == seen.plan.fingerprint()
    theirs.add_stage("drill_stages", Stage(400, schedule=BatchSchedule.constant(32)), current_step=50)
    with pytest.raises(RunChangedError) as refused:
        mine.add_stage("drill_stages", Stage(350, schedule=BatchSchedule.constant(16)), current_step=50)
    assert str(refused.value) == (
        f"Run 'drill_stages' changed while this stage was being added: another writer appended stage(s) starting at "
        f"step 400 (run fingerprint now {theirs.get('drill_stages').plan.fingerprint()}, was "
        f"{run.plan.fingerprint()}). Run 'drill_stages' cannot take a stage at step 350: its last stage starts at "
        "step 400, and stages are appended in order. The earliest step a new stage may start at is 401.")
    # A stage this writer could have known was invalid is its own error (400), not a conflict.
    with pytest.raises(RunError) as own:
        mine.add_stage("drill_stages", Stage(390, schedule=BatchSchedule.constant(16)), current_step=50)
    assert not isinstance(own.value, RunConflictError)
    assert [s.start for s in RunStore(str(tmp_path)).get("drill_stages").plan.stages] == [200, 300, 400]


def test_a_loser_rereads_when_its_swap_fails_and_the_refusal_names_what_it_lost_to(tmp_path, monkeypatch):
    from taskdata import cas

    store = RunStore(str(tmp_path))
    store.create(synthetic_run())
    fresh = RunStore(str(tmp_path))  # has read nothing: what it meant to change is its first read
    swap = cas.swap
    raced = []

    def swap_after_another_writer(version, data):
        if not raced:  # between this writer's read and its swap, another writer appends
            raced.append(version)
            store.add_stage("drill_stages", Stage(500, schedule=BatchSchedule.constant(32)), current_step=0)
        return swap(version, data)

    monkeypatch.setattr(cas, "swap", swap_after_another_writer)
    with pytest.raises(RunChangedError, match=r"another writer appended stage\(s\) starting at step 500 "):
        fresh.add_stage("drill_stages", Stage(100, schedule=BatchSchedule.constant(16)), current_step=0)
    assert [s.start for s in RunStore(str(tmp_path)).get("drill_stages").plan.stages] == [500]


def test_a_plan_add_stage_that_other_writers_keep_beating_exits_3_saying_nothing_was_stored(tmp_path, monkeypatch,
                                                                                            capsys):
    from taskdata import cas
    from taskdata.cli import main

    RunStore(str(tmp_path)).create(synthetic_run())
    monkeypatch.setattr(cas, "MAX_ATTEMPTS", 2)
    monkeypatch.setattr(cas, "swap", lambda version, data: None)  # another writer was first, each time
    code = main(["plan", "--name", "drill_stages", "--cache-root", str(tmp_path), "--add-stage", "100:batch=16",
                 "--current-step", "0"])
    err = capsys.readouterr().err
    assert code == 3 and err.startswith("taskdata plan: error: Gave up changing ") and "not stored" in err, err
    assert RunStore(str(tmp_path)).get("drill_stages").plan.stages == ()


def test_servers_reserve_steps_and_no_stage_starts_among_them(tmp_path):
    store = RunStore(str(tmp_path))
    store.create(synthetic_run())
    assert store.reserve("drill_stages", 120).served_before == 120
    assert store.reserve("drill_stages", 80).served_before == 120  # never lowered
    record = json.loads(Path(store.path("drill_stages")).read_text())
    assert record["format"] == "taskdata.run/4" and record["served_before"] == 120
    with pytest.raises(RunConflictError, match=r"servers may have answered steps up to 119 already .* The earliest "
                                               r"step a new stage may start at is 120 \(also at least the current "
                                               r"step, 150\)\.$"):
        store.add_stage("drill_stages", Stage(100, schedule=BatchSchedule.constant(16)), current_step=150)
    run, added = store.add_stage("drill_stages", Stage(120, schedule=BatchSchedule.constant(16)), current_step=0)
    assert added and run.served_before == 120
    # A stage appended keeps the reservation, and a record without one (format 3) reads as 0.
    old = {"format": "taskdata.run/3", "plan": synthetic_run("old").plan.to_dict()}
    assert StoredRun.from_dict(old).served_before == 0


def test_writers_creating_one_name_at_once_are_told_the_truth(tmp_path):
    runs = [synthetic_run(), synthetic_run(num_data_shards=4)]
    told: list[tuple[int, object]] = []
    barrier = threading.Barrier(8)

    def create(i: int) -> None:
        store = RunStore(str(tmp_path))
        barrier.wait()
        try:
            told.append((i % 2, store.create(runs[i % 2])))
        except RunConflictError as error:
            told.append((i % 2, error))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = RunStore(str(tmp_path)).get("drill_stages").plan.num_data_shards
    winner = 0 if stored == 8 else 1
    assert sorted(str(outcome) for _, outcome in told if outcome is True) == ["True"]
    assert all(outcome in (True, False) for plan, outcome in told if plan == winner)
    assert all(isinstance(outcome, RunConflictError) for plan, outcome in told if plan != winner)
