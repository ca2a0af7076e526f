"""The end-to-end drill (``deploy/drill.py``) in a small size, and what it does when a stage fails.

Each drill gets its own bucket name, which is on the command line of every process it starts (the
emulator's ``--default-bucket``, every ``gs://`` path), so the tests can see that no such process is
left running, without trusting pids that the system may have reused.
"""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from deploy.drill import STAGES, DrillConfig, DrillError, run_drill


def unique_bucket() -> str:
    return f"drill-{uuid.uuid4().hex[:12]}"


def processes_mentioning(marker: str) -> list[tuple[int, str]]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited while we looked
        if marker in command:
            found.append((int(entry), command))
    return found


def test_config_refuses_a_kill_before_the_first_checkpoint_or_after_the_end(tmp_path):
    with pytest.raises(ValueError, match="kill_at_step must be at least checkpoint_every"):
        DrillConfig(work_dir=str(tmp_path), steps=12, checkpoint_every=4, kill_at_step=3)
    with pytest.raises(ValueError, match=r"below steps - 1 \(11\)"):
        DrillConfig(work_dir=str(tmp_path), steps=12, checkpoint_every=4, kill_at_step=11)
    with pytest.raises(ValueError, match="batch_size must be a multiple of 4"):
        DrillConfig(work_dir=str(tmp_path), batch_size=6)
    assert DrillConfig(work_dir=str(tmp_path), steps=12).kill_step == 6


@pytest.mark.timeout(1200)  # longer than the default: minutes on a loaded machine
@pytest.mark.slow
def test_small_drill_passes_every_stage_and_leaves_no_process(tmp_path):
    bucket = unique_bucket()
    config = DrillConfig(
        work_dir=str(tmp_path),
        train_docs=400,
        validation_docs=40,
        vocab_size=400,
        steps=12,
        batch_size=8,
        checkpoint_every=3,
        kill_at_step=6,
        kill_process=2,
        predict_examples=5,
        stage_timeout=240,
        bucket=bucket,
    )
    lines: list[str] = []
    report = run_drill(config, out=lines.append)

    assert [stage.name for stage in report.stages] == list(STAGES)
    assert [line.split()[1] for line in lines] == list(STAGES), "one printed line per stage"
    assert processes_mentioning(bucket) == [] and processes_mentioning(str(tmp_path)) == []
    facts = report.facts
    assert (
        facts["cache"]["identical_files"] == 30
    )  # 2 splits x 4 shards x (shard + offsets + origins sidecar) + 6 metadata files
    preempted, resumed = facts["preempted"], facts["resumed"]
    assert preempted["killed_process"] == 2 and preempted["exit_codes"][2] == -9
    # Each survivor said why (exit 1; the drill checks the words), unless gloo aborted it on a collective left
    # half done by the killed peer (SIGABRT before its Python code runs; the drill names it): not all of them.
    aborted = preempted["aborted_by_gloo"]
    assert set(aborted) < {0, 1, 3} and all(preempted["exit_codes"][i] == -signal.SIGABRT for i in aborted)
    assert all(preempted["exit_codes"][i] == 1 for i in {0, 1, 3} - set(aborted)), (
        "each other said why (checked)"
    )
    assert sorted(preempted["exit_seconds"]) == [0, 1, 3] and max(preempted["exit_seconds"].values()) < 60
    assert 3 <= preempted["checkpoint"] <= preempted["last_logged_step"] + 1 < 12
    assert resumed["from_step"] == preempted["checkpoint"]
    evaluation = facts["eval"]
    validation = facts["cache"]["records"]["validation"]
    assert (evaluation["num_scored"], evaluation["num_missing"]) == (5, validation - 5)
    assert evaluation["targets_source"]["cache"] == f"gs://{bucket}/cache"


@pytest.mark.slow
def test_a_failing_stage_is_named_and_every_process_it_started_is_stopped(tmp_path):
    bucket = unique_bucket()
    # 40 documents cannot give 30,000 pieces: 'taskdata vocab train' fails after the emulator started.
    config = DrillConfig(
        work_dir=str(tmp_path),
        train_docs=40,
        validation_docs=4,
        vocab_size=30_000,
        stage_timeout=120,
        bucket=bucket,
    )
    lines: list[str] = []
    with pytest.raises(
        DrillError, match=r"drill stage 'vocabulary' failed: RuntimeError: vocab-train exited"
    ) as info:
        run_drill(config, out=lines.append)
    assert info.value.stage == "vocabulary"
    assert "30000" in str(info.value) or "30,000" in str(info.value), "the log's tail says what went wrong"
    assert [line.split()[1] for line in lines] == ["storage"]
    assert processes_mentioning(bucket) == []
