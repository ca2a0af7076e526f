"""A real Dask cluster on 127.0.0.1 for tests, drills and benchmarks: a ``distributed`` scheduler and worker
processes, each started as its own process as on a cluster's machines (``python -m distributed.cli.dask_scheduler``
/ ``dask_worker``), and stopped by process group.

Each worker runs under a nanny (dask_worker's default), which starts a new worker process when one dies, as a
cluster manager restarts a lost machine or pod. Workers start in their own folder (``cwd``), not the launcher's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class DaskCluster:
    address: str
    cwd: Path  # where the workers run (``python -m`` puts it first on their sys.path)
    processes: list[subprocess.Popen]

    def worker_pids(self) -> dict[str, int]:
        """{worker address: pid} of the worker processes now connected (not their nannies)."""
        from distributed import Client

        with Client(self.address, timeout=30, set_as_default=False) as client:
            return dict(client.run(os.getpid))

    def wait_for_workers(self, count: int, timeout: float = 120) -> None:
        from distributed import Client

        with Client(self.address, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(count, timeout=timeout)


@contextlib.contextmanager
def dask_cluster(workers: int, cwd: Path, env: dict[str, str] | None = None, *,
                 threads: int = 1) -> Iterator[DaskCluster]:
    """A scheduler and ``workers`` worker processes (``threads`` threads each) in ``cwd``, with ``env`` (default:
    this one), plus the repository on ``PYTHONPATH`` so that workers import task modules such as ``tests.cache_tasks``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cwd.mkdir(parents=True, exist_ok=True)
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    processes = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                   "--port", str(port), "--no-dashboard"], cwd=cwd, env=env,
                                  start_new_session=True, **quiet)]
    cluster = DaskCluster(address, cwd, processes)
    try:
        if workers:
            for i in range(workers):
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "1", "--nthreads",
                     str(threads), "--host", "127.0.0.1", "--no-dashboard", "--name", f"w{i}",
                     "--local-directory", str(cwd / f"w{i}")],
                    cwd=cwd, env=env, start_new_session=True, **quiet))
            cluster.wait_for_workers(workers)
        else:
            _wait_for_port(port, processes[0])
        yield cluster
    finally:
        for process in reversed(processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise
            time.sleep(0.2)
