"""The example trainer as separate processes: batch hashes, SIGTERM/SIGKILL preemption, several hosts, elastic resume,
a process failing with an error (its peers stop at once). A host SIGKILLed mid-run (every other process exits on its
own, saying how to resume) is the drill's train-preempted stage (tests/test_drill.py).

Every trainer is a ``python -m trainer_client.example.train`` process stopped by its pid when the test ends;
each wait is bounded. The reference for every comparison is the global batch one process builds with
numpy alone (``client_helpers.reference_hashes``): no JAX, no server.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from tests.client_helpers import (
    MODEL_ARGS,
    Trainer,
    free_port,
    multi_host_args,
    reference_hashes,
    serve,
    shared_compilation_cache,
    shared_root,
    trainers,
    wait_for_log_step,
)
from trainer_client.example.batch_log import read_batch_log, read_batch_log_lines
from trainer_client.example.checkpoint import committed_steps

pytestmark = pytest.mark.timeout(900)  # trainers: minutes each on a loaded machine

STARTUP = 180  # seconds a trainer may take to start, compile and finish its steps on a loaded 2-core machine


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    return shared_compilation_cache(tmp_path_factory)


def trainer_args(data: list[str], out, steps: int, jax_cache: str, every: int = 5) -> list[str]:
    return [
        *data,
        "--steps", str(steps),
        "--checkpoint-dir", str(out / "ckpt"),
        "--checkpoint-every", str(every),
        "--log", str(out / "log.jsonl"),
        "--inputs-length", "8",
        "--targets-length", "176",
        "--compilation-cache", jax_cache,
        *MODEL_ARGS,
    ]  # fmt: skip


def hashes(path) -> dict[int, str]:
    return {step: entry["hash"] for step, entry in read_batch_log(str(path)).items()}


@pytest.mark.slow
def test_resuming_a_checkpoint_against_another_run_fails_loudly(root, jax_cache, tmp_path):
    args = trainer_args(["--cache-root", root, "--run", "mix4"], tmp_path, 2, jax_cache)
    with trainers([Trainer(args, stderr_path=str(tmp_path / "err"))]) as (first,):
        first.check(STARTUP)
    other = trainer_args(["--cache-root", root, "--run", "other_seed"], tmp_path, 4, jax_cache)
    with trainers([Trainer(other, stderr_path=str(tmp_path / "err2"))]) as (second,):
        second.check(STARTUP, expected=2)
    error = (tmp_path / "err2").read_text()
    assert "python -m trainer_client.example.train: error: " in error and "but run 'other_seed' has fingerprint" in error
    assert "Traceback" not in error
    assert max(hashes(tmp_path / "log.jsonl")) == 1, "nothing was trained on the other run"


@pytest.mark.slow
def test_preempted_run_equals_the_uninterrupted_one(root, jax_cache, tmp_path):
    """8 kills at random steps, SIGTERM and SIGKILL mixed; then the run finishes.

    A SIGTERM'd trainer finishes the step in progress, checkpoints the next one and exits 0.

    After a SIGKILL the restart repeats the steps since the last checkpoint, so the log holds them
    twice: deduplicated by step (last write wins) it must equal the uninterrupted log, and every
    repeated step must have logged the same batch and the same loss both times.
    """
    total, kills = 56, 8
    expected = reference_hashes(root, "mix4", range(total))
    other = reference_hashes(root, "other_seed", range(total))
    # Negative control: another seed reads other batches once the first epoch is over (step 29).
    assert all(other[s] == expected[s] for s in range(28)) and all(
        other[s] != expected[s] for s in range(30, total)
    )
    data = ["--cache-root", root, "--run", "mix4"]
    clean_dir, run_dir = tmp_path / "clean", tmp_path / "preempted"
    with trainers([Trainer(trainer_args(data, clean_dir, total, jax_cache, every=4))]) as (clean,):
        clean.check(STARTUP)
    assert hashes(clean_dir / "log.jsonl") == expected
    rng = np.random.default_rng(20261122)
    signals = [signal.SIGTERM, signal.SIGKILL] * (kills // 2)
    rng.shuffle(signals)
    log = str(run_dir / "log.jsonl")
    args = trainer_args(data, run_dir, total, jax_cache, every=4)
    for i, signum in enumerate(signals):
        done = max(hashes(log), default=-1) if os.path.exists(log) else -1
        with trainers([Trainer(args, stderr_path=str(run_dir / "err"))]) as (trainer,):
            wait_for_log_step(log, done + int(rng.integers(1, 5)), trainer, STARTUP)
            trainer.signal(signum)
            code = trainer.wait(STARTUP)
        assert code in ((0,) if signum == signal.SIGTERM else (-signal.SIGKILL, 0)), f"kill {i}: exit {code}"
        if signum == signal.SIGTERM:
            assert committed_steps(str(run_dir / "ckpt"))[-1] == max(hashes(log)) + 1, f"kill {i}"
    assert max(hashes(log)) < total - 1, "the kills all happened before the end of the run"
    with trainers([Trainer(args, stderr_path=str(run_dir / "err"))]) as (last,):
        last.check(STARTUP)

    entries = read_batch_log_lines(log)
    clean_log = read_batch_log(str(clean_dir / "log.jsonl"))
    assert sorted(read_batch_log(log)) == list(range(total))
    assert read_batch_log(log) == clean_log
    for entry in entries:  # repeated steps: the same batch, and the same parameters before it
        assert entry == clean_log[entry["step"]]
    assert len(entries) > total, "at least one SIGKILL made the run repeat steps"


@pytest.mark.slow
def test_two_hosts_build_the_single_process_batches_and_stop_together_on_sigterm(root, jax_cache, tmp_path):
    """2 processes (jax.distributed, 2 devices each, one server); SIGTERM reaches only process 1."""
    steps = 16
    expected = reference_hashes(root, "mix4", range(steps))
    log = str(tmp_path / "log.jsonl")
    with serve(root) as url:
        data = ["--server", url, "--run", "mix4"]
        args = trainer_args(data, tmp_path, steps, jax_cache, every=100)

        def start() -> list[Trainer]:
            return [
                Trainer([*args, *extra], devices=2, stderr_path=str(tmp_path / f"err{i}"))
                for i, extra in enumerate(multi_host_args(2, free_port()))
            ]

        group = start()
        with trainers(group):
            wait_for_log_step(log, 3, group[0], STARTUP)
            group[1].signal(signal.SIGTERM)  # only process 1 is told; process 0 writes log and checkpoint
            for trainer in group:
                trainer.check(STARTUP)
        assert committed_steps(str(tmp_path / "ckpt")) == [max(hashes(log)) + 1]
        assert max(hashes(log)) + 1 < steps, "the run was stopped before its end"
        group = start()
        with trainers(group):
            for trainer in group:
                trainer.check(STARTUP)
    assert [e["step"] for e in read_batch_log_lines(log)] == list(range(steps))
    assert hashes(log) == expected


@pytest.mark.slow
def test_four_hosts_build_the_single_process_batches_and_two_hosts_resume_them(root, jax_cache, tmp_path):
    """Elastic: 4 processes (mesh data=8) to step 10, checkpoint, then 2 with a model axis of 2 (data=2) to 20.

    Same run (4 data shards); each of the 2 hosts reads two consecutive data shards from the server.
    """
    expected = reference_hashes(root, "mix4", range(20))
    log = str(tmp_path / "log.jsonl")
    with serve(root) as url:
        data = ["--server", url, "--run", "mix4"]
        for processes, steps, model in ((4, 10, 1), (2, 20, 2)):
            args = [*trainer_args(data, tmp_path, steps, jax_cache, every=100), "--model-axis", str(model)]
            group = [
                Trainer([*args, *extra], devices=2, stderr_path=str(tmp_path / f"err{processes}.{i}"))
                for i, extra in enumerate(multi_host_args(processes, free_port()))
            ]
            with trainers(group):
                for trainer in group:
                    trainer.check(STARTUP)
            assert committed_steps(str(tmp_path / "ckpt"))[-1] == steps
    assert [e["step"] for e in read_batch_log_lines(log)] == list(range(20))
    assert hashes(log) == expected


def exits_after(group: list[Trainer], since: float, limit: float) -> dict[int, tuple[int, float]]:
    """Process index -> (exit code, seconds after ``since``) for every trainer of ``group``, waiting at most ``limit``."""
    ended: dict[int, tuple[int, float]] = {}
    while len(ended) < len(group) and time.monotonic() - since < limit:
        for i, trainer in enumerate(group):
            code = trainer.process.poll()
            if i not in ended and code is not None:
                ended[i] = (code, time.monotonic() - since)
        time.sleep(0.05)
    return ended


@pytest.mark.slow
def test_a_process_that_fails_with_an_error_stops_its_peers_at_once(root, jax_cache, tmp_path):
    """Process 0 fails after training (its predictions cannot be written) while process 1 waits for it in a
    barrier: both exit with code 1 and the failure's message, well before JAX's shutdown barrier times out."""
    data = ["--cache-root", root, "--run", "mix4"]
    args = [
        *trainer_args(data, tmp_path, 2, jax_cache, every=2),
        "--predictions-out", str(tmp_path / "missing" / "file" / "preds.jsonl"),
        "--module", "tests.cache_tasks", "--predict-examples", "2",
    ]  # fmt: skip
    (tmp_path / "missing").write_text("a file where a folder should be")
    group = [
        Trainer([*args, *extra], devices=2, stderr_path=str(tmp_path / f"err{i}"))
        for i, extra in enumerate(multi_host_args(2, free_port()))
    ]
    with trainers(group):
        ended = exits_after(group, time.monotonic(), STARTUP)
    assert {i: code for i, (code, _) in ended.items()} == {0: 1, 1: 1}
    assert abs(ended[0][1] - ended[1][1]) < 10, ended
    for i in (0, 1):
        error = (tmp_path / f"err{i}").read_text()
        assert "taskdata: process 0 of 2 failed with " in error, error[-2000:]
        assert f"training goes on from the last committed checkpoint, step 2 in {tmp_path / 'ckpt'}" in error
