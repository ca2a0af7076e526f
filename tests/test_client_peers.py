"""PeerWatchdog's rules, and the watchdog in a small two-process ``jax.distributed`` job (``tests.peers_worker``).

The job tests read and write the coordination service through the client ``trainer_client.peers`` takes from
``jax._src``: the MaxText environment check (test_maxtext_env) runs them on its newer jax too. The watchdog inside
the example trainer: test_client_train's peer tests, the drill.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import pytest

from tests import peers_worker as worker
from tests.client_helpers import REPO, client_env, free_port
from trainer_client.peers import PeerWatchdog, _is_runtime_failure


def test_a_collective_that_lost_its_peer_counts_as_a_runtime_failure_and_a_python_error_does_not():
    gloo = ValueError(
        "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer"
    )
    assert _is_runtime_failure(gloo)
    assert _is_runtime_failure(jax.errors.JaxRuntimeError("INTERNAL: anything the runtime raises"))
    assert not _is_runtime_failure(ValueError("Step 3: feature 'inputs' holds token id 600, outside the vocabulary"))
    assert not _is_runtime_failure(FileNotFoundError(2, "No such file or directory"))


def test_the_watchdog_needs_a_distributed_job_and_a_period_below_its_timeout():
    with pytest.raises(ValueError, match="needs 0 < period < timeout but got period 5, timeout 5"):
        PeerWatchdog(lambda: "", timeout=5, period=5)
    with pytest.raises(RuntimeError, match="call jax.distributed.initialize first"):
        PeerWatchdog(lambda: "")


def run_job(scenario: str, tmp_path) -> list[tuple[int, str]]:
    """Both processes' exit codes and stderr."""
    port = free_port()
    processes = []
    for process in range(2):
        with open(tmp_path / f"err{process}", "wb") as err:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "tests.peers_worker", str(port), str(process), scenario], cwd=REPO,
                env=client_env(1), stdout=subprocess.DEVNULL, stderr=err))
    try:
        codes = [p.wait(timeout=120) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return [(code, (tmp_path / f"err{i}").read_text(errors="replace")) for i, code in enumerate(codes)]


@pytest.mark.slow
def test_in_a_job_a_process_that_fails_ends_its_peer_and_both_say_why(tmp_path):
    (code0, err0), (code1, err1) = run_job("failed", tmp_path)
    cause = "taskdata: process 1 of 2 failed with ValueError: the test's failure."
    assert code1 == 1 and f"{cause} Process 1 of 2 exits with code 1; the other processes stop too. {worker.HINT}" in err1, err1
    assert code0 == 1 and f"{cause} Process 0 of 2 cannot finish a step without it and exits with code 1. {worker.HINT}" in err0, err0


@pytest.mark.slow
def test_in_a_job_a_killed_process_is_named_by_its_peer_once_its_heartbeat_stops(tmp_path):
    (code0, err0), (code1, _) = run_job("killed", tmp_path)
    assert code1 == -9
    assert code0 == 1, err0
    assert (f"taskdata: process 1 of 2 stopped (no heartbeat for {worker.TIMEOUT:.0f} s: killed, crashed, or its host "
            f"was lost). Process 0 of 2 cannot finish a step without it and exits with code 1. {worker.HINT}") in err0, err0


@pytest.mark.slow
def test_in_a_job_processes_that_finish_and_stop_their_watchdogs_exit_normally(tmp_path):
    results = run_job("finished", tmp_path)
    assert [code for code, _ in results] == [0, 0], results
    assert all(f"process {i} finished" in err and "taskdata:" not in err for i, (_, err) in enumerate(results))
