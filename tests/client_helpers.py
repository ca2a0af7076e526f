"""Shared pieces of the trainer-client tests: toy caches and runs, an in-process server, trainer processes.

The caches are the two toy tasks of ``tests.cache_tasks`` (about 345 train records each, built in a
few seconds) mixed 1:3, so every batch interleaves two tasks the way c4 mixtures do. Three stored
runs share one plan but for their number of data shards (4, 2, 1), so they share one fingerprint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np

from taskdata.cache.reader import CacheReader
from taskdata.index import BatchSchedule, RunPlan, TaskCache
from taskdata.runs import RunStore, StoredRun
from trainer_client.assignments import HostSlice
from trainer_client.digest import batch_hash, row_digests
from trainer_client.local_source import LocalAssignments
from trainer_client.reading import BatchReader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = ("toy_det", "toy_random")
LENGTHS = {"inputs": 8, "targets": 176}  # the toy caches' longest examples
GLOBAL_BATCH = 16
RUNS = {"mix4": 4, "mix2": 2, "mix1": 1}
# Small enough to compile and step fast on CPU; the toy tasks use the byte vocabulary (384 ids).
MODEL_ARGS = ["--vocab-size", "384", "--d-model", "16", "--num-heads", "2", "--head-dim", "8", "--d-ff", "32"]


def make_plan(readers: dict[str, CacheReader], name: str, num_data_shards: int, seed: int = 5) -> RunPlan:
    return RunPlan(
        name=name,
        mixture="toy_mix",
        caches={t: TaskCache(r.manifest_sha256, r.record_counts("train")) for t, r in readers.items()},
        rates={"toy_det": 1, "toy_random": 3},
        seed=seed,
        schedule=BatchSchedule(start=GLOBAL_BATCH, end=GLOBAL_BATCH),
        num_data_shards=num_data_shards,
    )


def build_root(root: str) -> dict[str, str]:
    """Toy caches under ``root`` and the runs of ``RUNS`` (plus 'other_seed'); returns task -> version dir."""
    from tests.cache_helpers import build

    dirs = {task: build(root, task=task, num_shards=3).version_dir for task in TASKS}
    readers = {task: CacheReader(d) for task, d in dirs.items()}
    store = RunStore(root)
    for name, shards in RUNS.items():
        store.create(StoredRun(make_plan(readers, name, shards)))
    store.create(StoredRun(make_plan(readers, "other_seed", 4, seed=6)))
    return dirs


_SHARED: dict[str, str] = {}


def shared_root(tmp_path_factory) -> str:
    """One ``build_root`` per test session, shared by the client test modules (never modify it)."""
    if "root" not in _SHARED:
        root = str(tmp_path_factory.mktemp("client_root"))
        build_root(root)
        _SHARED["root"] = root
    return _SHARED["root"]


def shared_compilation_cache(tmp_path_factory) -> str:
    """One JAX persistent compilation cache per session: trainer restarts skip compiling."""
    if "jax_cache" not in _SHARED:
        _SHARED["jax_cache"] = str(tmp_path_factory.mktemp("jax_cache"))
    return _SHARED["jax_cache"]


def reference_hashes(root: str, run: str, steps: Sequence[int]) -> dict[int, str]:
    """Global batch hashes as one process builds them, numpy only (no JAX, no server)."""
    stored = RunStore(root).get(run)
    assert stored is not None
    source = LocalAssignments.from_cache_root(stored, root)
    reader = BatchReader(source.run_info(), LENGTHS)
    out = {}
    for step_reads in source.fetch(min(steps), max(steps) - min(steps) + 1, HostSlice(0, 1)):
        if step_reads.step in steps:
            out[step_reads.step] = batch_hash(row_digests(reader.read(step_reads).features))
    reader.close()
    source.close()
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(root: str, port: int | None = None, delay: float = 0.0, **settings: object) -> Iterator[str]:
    """The assignment server on 127.0.0.1 in a thread of this process (started after ``delay`` s)."""
    import uvicorn

    from server.main import create_app
    from server.settings import Settings
    from taskdata.define.registry import Registry

    port = port or free_port()
    app = create_app(Settings(cache_root=root, port=port, **settings), registry=Registry())
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )

    def run() -> None:
        time.sleep(delay)
        server.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not delay:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "server did not start within 20 s"
            time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def client_env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


class Trainer:
    """One ``python -m trainer_client.example.train`` process; always stopped by its pid when the test ends."""

    def __init__(self, args: Sequence[str], devices: int = 1, stderr_path: str | None = None):
        self.stderr_path = stderr_path
        if stderr_path:
            os.makedirs(os.path.dirname(stderr_path), exist_ok=True)
        err = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL  # noqa: SIM115 (closed below)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainer_client.example.train", *args],
            cwd=REPO,
            env=client_env(devices),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        if stderr_path:
            err.close()

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"trainer {self.pid} did not finish within {timeout} s{self._tail()}"
            ) from None

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def _tail(self) -> str:
        if not self.stderr_path or not os.path.exists(self.stderr_path):
            return ""
        with open(self.stderr_path, errors="replace") as f:
            return ":\n" + f.read()[-3000:]

    def check(self, timeout: float, expected: int = 0) -> None:
        code = self.wait(timeout)
        assert code == expected, f"trainer {self.pid} exited {code}, expected {expected}{self._tail()}"


@contextlib.contextmanager
def trainers(groups: Sequence[Trainer]) -> Iterator[Sequence[Trainer]]:
    try:
        yield groups
    finally:
        for trainer in groups:
            trainer.kill()


def multi_host_args(num_processes: int, port: int) -> list[list[str]]:
    return [
        [
            "--coordinator",
            f"127.0.0.1:{port}",
            "--num-processes",
            str(num_processes),
            "--process-id",
            str(i),
            "--init-timeout",
            "60",
        ]
        for i in range(num_processes)
    ]


def wait_for_log_step(path: str, step: int, trainer: Trainer, timeout: float) -> None:
    """Waits until the batch log holds ``step`` (or the trainer exits, or ``timeout`` passes)."""
    from trainer_client.example.batch_log import read_batch_log_lines

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and any(e["step"] >= step for e in read_batch_log_lines(path)):
            return
        if trainer.process.poll() is not None:
            return
        time.sleep(0.005)
    raise AssertionError(f"trainer {trainer.pid} did not log step {step} within {timeout} s")


def features_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
