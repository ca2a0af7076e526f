"""torchtitan 0.3.0's loader contract: ``TaskdataDataLoader`` built as torchtitan's trainer builds its loader, in
the torchtitan environment (deploy/torchtitan_env.sh, run as a subprocess: tests.torchtitan_check). Its micro
batches are the run's rows in the plan's order with next-token labels and torchtitan's IGNORE_INDEX; its state,
saved with torch.distributed.checkpoint on 2 data-parallel ranks, resumes at the exact step on 1 and on 4."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from tests.client_helpers import REPO, shared_root
from trainer_client.assignments import HostSlice
from trainer_client.iterator import DataIterator
from trainer_client.pytorch import IGNORE_INDEX, CacheRun, next_token_labels

pytestmark = pytest.mark.slow  # cache jobs (Beam), a subprocess in another environment

VENV = os.environ.get("TASKDATA_TORCHTITAN_VENV", os.path.join(REPO, ".venv-torchtitan"))
PYTHON = os.path.join(VENV, "bin", "python")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if not os.path.exists(PYTHON):
        message = f"no torchtitan environment at {VENV}: build it with 'bash deploy/torchtitan_env.sh'"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    root = shared_root(tmp_path_factory)
    checkpoint = tmp_path_factory.mktemp("torchtitan") / "checkpoint"
    result = subprocess.run([PYTHON, "-m", "tests.torchtitan_check", root, str(checkpoint)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, json.loads(result.stdout)


def run_rows(root, stop):
    """The run's global batches' targets, from the trainer client (this environment)."""
    with DataIterator(CacheRun(root, "mix2")(), {"targets": 176}, host_slice=HostSlice(0, 1), stop_step=stop) as it:
        return [b.features["targets"].copy() for b in it]


def as_array(batch, key):
    assert batch[key]["dtype"] == "torch.int64"
    return np.array(batch[key]["values"], np.int64)


def test_micro_batches_are_the_runs_rows_with_torchtitans_shift_and_masks(report):
    root, got = report
    expected = run_rows(root, 3)
    assert got["ignore_index"] == IGNORE_INDEX  # torchtitan.components.loss.IGNORE_INDEX
    for batch, rows in zip(got["before"], expected, strict=True):
        assert np.array_equal(as_array(batch, "input"), rows)
        labels = as_array(batch, "labels")
        assert np.array_equal(labels, next_token_labels(rows))
        assert np.array_equal(labels[:, :-1][rows[:, 1:] != 0], rows[:, 1:][rows[:, 1:] != 0])
        assert (labels[rows == 0] == IGNORE_INDEX).all()
        assert np.array_equal(as_array(batch, "positions"), np.broadcast_to(np.arange(176), rows.shape))


def test_a_state_saved_on_two_ranks_resumes_at_the_exact_step_on_one_and_on_four(report):
    root, got = report
    expected = run_rows(root, 6)
    assert got["states_equal"]  # one state for every rank: DCP keeps one copy
    for ranks in ("1", "4"):
        resumed = [as_array(batch, "input") for batch in got["after"][ranks]]
        assert all(np.array_equal(a, b) for a, b in zip(resumed, expected[3:], strict=True)), ranks


def test_a_checkpoint_inside_a_step_and_another_runs_state_are_refused(report):
    _, got = report
    assert got["inside_a_step"].startswith("A checkpoint was asked for inside step 3 of the run: 1 of its micro batches")
    assert "ResumeError: The data state belongs to a run with fingerprint" in got["other_run"]
