"""torch.distributed on gloo, processes on 127.0.0.1: DCP saves the model, its optimizer and the data state
(``RunIterableDataset``) of a 2-process job; a restart on 1 process and on 2 loads them and continues at the exact
step with the uninterrupted run's global batches (hashes logged by ``tests.torch_trainer``); a restart against
another run refuses the saved state."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.client_helpers import REPO, free_port, reference_hashes, shared_root

pytestmark = pytest.mark.slow  # cache jobs (Beam), trainer processes


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def launch(processes: int, *args: str, timeout: float = 180) -> list[subprocess.CompletedProcess]:
    """``tests.torch_trainer`` on ``processes`` ranks (torchrun's variables), waited for together."""
    port = str(free_port())
    ranks = []
    for rank in range(processes):
        env = {**os.environ, "PYTHONPATH": REPO, "RANK": str(rank), "WORLD_SIZE": str(processes),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        ranks.append(subprocess.Popen([sys.executable, "-m", "tests.torch_trainer", *args], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for process in ranks:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            raise
        results.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return results


def records(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_dcp_saves_model_and_data_state_and_restarts_on_one_and_two_processes_at_the_exact_step(root, tmp_path):
    reference = reference_hashes(root, "mix2", range(30, 42))
    assert reference != reference_hashes(root, "other_seed", range(30, 42))  # another seed: other batches
    common = ["--root", root, "--run", "mix2", "--checkpoint", str(tmp_path / "checkpoint")]

    first = tmp_path / "first.jsonl"
    for result in launch(2, *common, "--log", str(first), "--start", "30", "--save-at", "36", "--stop", "36"):
        assert result.returncode == 0, result.stderr[-3000:]
    logged = records(first)
    assert {r["step"]: r["hash"] for r in logged if "step" in r} == {s: reference[s] for s in range(30, 36)}
    saved = logged[-1]
    assert saved["event"] == "saved" and saved["data"]["step"] == 36

    for processes in (1, 2):
        log = tmp_path / f"resumed_{processes}.jsonl"
        for result in launch(processes, *common, "--log", str(log), "--resume", "--stop", "42"):
            assert result.returncode == 0, result.stderr[-3000:]
        restored, *steps = records(log)
        assert restored["event"] == "restored" and restored["processes"] == processes
        assert restored["data"] == saved["data"] and restored["checksum"] == saved["checksum"]  # model and data
        assert {r["step"]: r["hash"] for r in steps} == {s: reference[s] for s in range(36, 42)}

    other = ["--root", root, "--run", "other_seed", "--checkpoint", str(tmp_path / "checkpoint")]
    refused = launch(1, *other, "--log", str(tmp_path / "other.jsonl"), "--resume", "--stop", "42")
    for result in refused:
        assert result.returncode != 0
        assert "ResumeError: The data state belongs to a run with fingerprint" in result.stderr
    assert not (tmp_path / "other.jsonl").exists() or not records(tmp_path / "other.jsonl")
