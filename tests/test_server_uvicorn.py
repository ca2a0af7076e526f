"""The real server: ``taskdata serve`` under uvicorn on 127.0.0.1, in subprocesses stopped by their pid.

Two replicas and a restart answer byte for byte the same as each other and as the in-process app; the
bearer token never reaches a log; ``taskdata plan`` stores runs the way ``POST /runs`` does.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from fastapi.testclient import TestClient

from server.main import create_app
from server.settings import Settings
from taskdata.index import BatchSchedule, SkipRange
from taskdata.runs import RunStore, build_run
from tests.helpers import metric_samples
from tests.run_helpers import copy_caches, make_registry, mix_run, shared_caches
from tests.server_helpers import REPO, Server, environment, free_port

pytestmark = pytest.mark.slow  # cache jobs (Beam)

TOKEN = "uvicorn-token-5e1f0c7a2b"
WRONG = "wrong-token-77aa31"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = copy_caches(tmp_path_factory, "uvicorn")
    runs_file = root.parent / "runs.json"
    runs_file.write_text(
        json.dumps([mix_run(root).to_dict(), mix_run(root, name="mix_seed8", seed=8).to_dict()])
    )
    token_file = root.parent / "token"
    token_file.write_text(TOKEN + "\n")
    text_dir = shared_caches(tmp_path_factory).parent / "caches-text"
    return root, runs_file, token_file, text_dir


REQUESTS = [
    {"host": 0, "step": 0},
    {"host": 3, "step": 12_000},
    {"host": 1, "step": 5, "steps": 8},
    {"host": 7, "step": 100, "steps": 3, "num_hosts": 8},
    {"host": 2, "step": 10**15, "steps": 2},
    {"host": 2, "step": 10**15, "steps": 2, "run": "mix_seed8"},
    {"host": 4, "step": 0},  # 400: outside [0, 4)
    {"host": 0, "step": -1},  # 422
    {"host": 0, "step": 0, "run": "nope"},  # 404
]


def fetch_all(url: str) -> list[tuple[int, bytes]]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30.0) as client:
        return [(r.status_code, r.content) for r in (client.get("/shards", params=p) for p in REQUESTS)]


def test_replicas_and_restarts_answer_byte_identically_and_never_log_the_token(setup, tmp_path):
    root, runs_file, token_file, text_dir = setup
    args = [
        "--cache-root",
        str(root),
        "--runs-file",
        str(runs_file),
        "--default-run",
        "mix",
        "--module",
        "tests.cache_tasks",
    ]
    a = Server([*args, "--token-file", str(token_file)], environment(text_dir), tmp_path / "a.log")
    try:
        b = Server(args, environment(text_dir, TASKDATA_SERVER_TOKEN=TOKEN), tmp_path / "b.log")
        try:
            answers = fetch_all(a.url)
            assert [status for status, _ in answers] == [200] * 6 + [400, 422, 404]
            assert fetch_all(b.url) == answers
            assert answers[4][1] != answers[5][1]  # negative control: another seed, other reads
            assert httpx.get(f"{b.url}/runs").status_code == 401
            assert httpx.get(f"{b.url}/runs", headers={"Authorization": f"Bearer {WRONG}"}).status_code == 401
            metrics = httpx.get(f"{b.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
            shards_200 = (("method", "GET"), ("route", "/shards"), ("status", "200"))
            assert metric_samples(metrics)["taskdata_http_requests_total"][shards_200] == 6
        finally:
            b.stop()
        a.stop()
        # A graceful shutdown on SIGTERM (uvicorn then re-raises the signal: exit status -15).
        assert a.process.returncode in (0, -15) and "Finished server process" in a.log.read_text()
        restarted = Server(
            [*args, "--token-file", str(token_file)], environment(text_dir), tmp_path / "a2.log"
        )
        try:
            assert fetch_all(restarted.url) == answers
        finally:
            restarted.stop()
    finally:
        a.stop()
    # The in-process app over the same files gives the same bytes (nothing depends on the process).
    app = create_app(
        Settings(cache_root=str(root), runs_file=str(runs_file), default_run="mix"), make_registry()
    )
    with TestClient(app) as client:
        assert [
            (r.status_code, r.content) for r in (client.get("/shards", params=p) for p in REQUESTS)
        ] == answers
    logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "GET /shards?host=3&step=12000 HTTP/1.1" in logs  # the access log was captured...
    assert TOKEN not in logs and WRONG not in logs  # ...and holds no token


def test_serve_reports_a_bad_runs_file_in_one_line(setup, tmp_path):
    root, _, _, text_dir = setup
    bad = tmp_path / "runs.json"
    bad.write_text("[{")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "taskdata",
            "serve",
            "--cache-root",
            str(root),
            "--runs-file",
            str(bad),
            "--port",
            str(free_port()),
        ],
        cwd=REPO,
        env=environment(text_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"taskdata serve: error: The runs file {bad} is not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_command_stores_the_run_post_runs_would(setup, tmp_path_factory):
    root = copy_caches(tmp_path_factory, "plan-cli")
    _, _, _, text_dir = setup

    def plan(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "taskdata",
                "plan",
                "--module",
                "tests.cache_tasks",
                "--cache-root",
                str(root),
                "--name",
                "cli_run",
                "--mixture",
                "toy_det",
                "--batch-size",
                "8",
                "--num-data-shards",
                "2",
                "--skip",
                "3:5",
                *extra,
            ],
            cwd=REPO,
            env=environment(text_dir),
            capture_output=True,
            text=True,
            timeout=60,
        )

    first = plan("--seed", "1")
    assert first.returncode == 0, first.stderr
    expected = build_run(
        make_registry(),
        str(root),
        name="cli_run",
        mixture="toy_det",
        seed=1,
        schedule=BatchSchedule.constant(8),
        num_data_shards=2,
        skip=(SkipRange(3, 5),),
    )
    assert RunStore(str(root)).get("cli_run").to_dict() == expected.to_dict()
    assert first.stdout.startswith("created ") and expected.plan.fingerprint() in first.stdout
    again = plan("--seed", "1")
    assert again.returncode == 0 and again.stdout.startswith("unchanged ")
    conflict = plan("--seed", "2")
    assert (
        conflict.returncode == 2 and "Run 'cli_run' already exists with a different plan" in conflict.stderr
    )
    bad_skip = plan("--seed", "1", "--skip", "7")
    assert bad_skip.returncode == 2 and "--skip must be START:STOP" in bad_skip.stderr
