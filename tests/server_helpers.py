"""The assignment service in tests (not a test module): the app in-process over the shared caches, and
``taskdata serve`` as a real process.

``server_env`` copies tests/run_helpers.py's shared caches (a Beam job the first time) and stores two runs:
``mix`` (toy_mix: 3 tasks, batch 16, 4 data shards, seed 7; the default run) and ``solo`` (toy_det, ramp
4 -> 8 over 6 steps, 2 data shards, steps [2, 4) skipped). ``Server`` starts a subprocess: slow tests only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from server.main import create_app
from server.settings import Settings, get_settings
from taskdata.index import BatchSchedule, SkipRange
from taskdata.runs import StoredRun, build_run
from tests.run_helpers import copy_caches, make_registry, mix_run, shared_caches

__all__ = ["REPO", "START_TIMEOUT", "TOKEN", "Server", "environment", "free_port", "make_app", "server_env",
           "solo_run"]

REPO = str(Path(__file__).resolve().parent.parent)
TOKEN = "tok-9f8e7d6c5b4a-secret"
START_TIMEOUT = 60.0


def solo_run(root: Path) -> StoredRun:
    return build_run(
        make_registry(),
        str(root),
        name="solo",
        mixture="toy_det",
        seed=3,
        schedule=BatchSchedule.ramp(4, 8, 6, multiple_of=4),
        num_data_shards=2,
        skip=(SkipRange(2, 4),),
    )


def server_env(tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    """A copy of the shared caches with a runs file of ``mix`` and ``solo`` (see the module's docstring)."""
    root = copy_caches(tmp_path_factory, "server")
    runs_file = root.parent / "runs.json"
    mix, solo = mix_run(root), solo_run(root)
    # One run record and one bare plan: the runs file takes both forms.
    runs_file.write_text(json.dumps([mix.to_dict(), solo.plan.to_dict()]))
    text_dir = shared_caches(tmp_path_factory).parent / "caches-text"
    return types.SimpleNamespace(root=root, runs_file=runs_file, mix=mix, solo=solo, text_dir=text_dir)


def make_app(env: types.SimpleNamespace, **settings: object) -> FastAPI:
    """The app over ``server_env``'s caches and runs (default run ``mix``); ``settings`` override fields."""
    app = create_app(registry=make_registry())
    fields = {"cache_root": str(env.root), "runs_file": str(env.runs_file), "default_run": "mix", **settings}
    app.dependency_overrides[get_settings] = lambda: Settings(**fields)
    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(text_dir: Path, **extra: str) -> dict[str, str]:
    """This environment without TASKDATA_SERVER_* settings, with the repository importable (the test tasks)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKDATA_SERVER_")}
    env.update(PYTHONPATH=REPO, TASKDATA_TEST_TEXT_DIR=str(text_dir), **extra)
    return env


class Server:
    """``taskdata serve`` on a free port of 127.0.0.1 in a subprocess, logging into a file; ``stop()`` ends it."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.port = free_port()
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "taskdata",
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    *args,
                ],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"server did not answer /healthz within {START_TIMEOUT} s:\n{log.read_text()}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM to this pid: uvicorn shuts down gracefully
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
