"""The cache job on Beam's Dask runner, on a real local cluster: a scheduler and two worker processes started as
separate processes (``deploy/dask_cluster.py``), one cluster for the module.

The workers run in a folder of their own, with the GCS emulator's address in their environment; the launcher runs
in the test process (or the ``taskdata`` command line as a subprocess).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.dask_cluster import dask_cluster, free_port
from taskdata.beam.job import CacheJobError, CacheOptions, run_cache_job
from taskdata.cache.format import list_versions
from taskdata.config import Config
from taskdata.define.registry import Registry
from tests.cache_helpers import MODULE, build, files_of
from tests.gcs_emulator import gcs_emulator

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BUCKET = "dask-cache"


def _require_dask() -> None:
    # CI installs the test extra, which has Dask: there a missing Dask is a failure, not a skip.
    if importlib.util.find_spec("distributed") is None:
        message = "dask[distributed] is not installed (pip install -e '.[test]' installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def emulator_env():
    with gcs_emulator(BUCKET) as env:
        yield env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, emulator_env):
    _require_dask()
    with dask_cluster(2, tmp_path_factory.mktemp("dask-workers"), emulator_env) as running:
        yield running


@pytest.fixture(autouse=True)
def _worker_import_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def build3(output, task="toy_random", **kwargs):
    """``build`` with 3 output shards per split, toy_random by default."""
    return build(output, task=task, num_shards=3, **kwargs)


def dask_args(cluster, *extra: str) -> list[str]:
    return ["--runner=dask", f"--dask_client_address={cluster.address}", *extra]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """toy_random (6 train and 2 validation source shards, 3 output shards each) built in-process."""
    return files_of(build3(tmp_path_factory.mktemp("reference")).version_dir)


def test_dask_workers_build_the_in_process_runners_bytes(cluster, reference, tmp_path, monkeypatch):
    from distributed import Client

    # A relative --output names the launcher's folder, not the workers' (they run elsewhere).
    monkeypatch.chdir(tmp_path)
    logs: list[str] = []
    with Client(cluster.address, set_as_default=False) as client:
        client.get_task_stream(start=0, stop=0)  # the scheduler records tasks from here on
        started = time.time()
        result = build3("cache", beam_args=dask_args(cluster), logs=logs)
        tasks = client.get_task_stream(start=started)
    assert result.version_dir == str(tmp_path / "cache" / "toy_random" / Path(result.version_dir).name)
    assert files_of(result.version_dir) == reference
    assert any(line.startswith("[cache] Dask cluster ready: 2 workers") for line in logs), logs
    # Every source shard is its own task (not Beam's 128 to a partition), and both workers ran some.
    preprocess = [t for t in tasks if str(t["key"]).startswith("('apply_dofn_to_bundle")]
    assert len({t["worker"] for t in preprocess}) == 2, preprocess
    assert not (Path(result.version_dir) / "_tmp").exists()


def test_a_packed_task_on_dask_is_byte_identical_and_the_seed_still_decides(cluster, tmp_path):
    on_dask = files_of(build3(tmp_path / "dask", task="toy_packed", seed=1, beam_args=dask_args(cluster)).version_dir)
    assert on_dask == files_of(build3(tmp_path / "local", task="toy_packed", seed=1).version_dir)
    other_seed = files_of(build3(tmp_path / "seed0", task="toy_packed", seed=0).version_dir)
    differing = [name for name in on_dask if name.endswith("-of-00003") and on_dask[name] != other_seed[name]]
    assert len(differing) == 6, differing  # negative control: another seed, other shards


# In a child process: gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT when imported, which may have happened here.
_GS_DIGESTS = (
    "import hashlib, json, sys\n"
    "from taskdata import fs\n"
    "filesystem, inner = fs.filesystem(sys.argv[1])\n"
    "print(json.dumps({p[len(inner) + 1:]: hashlib.sha256(filesystem.cat(p)).hexdigest() "
    "for p in filesystem.find(inner)}))\n"
)


def test_dask_workers_write_a_gs_cache_byte_identical_to_a_local_build(cluster, emulator_env, reference):
    command = [sys.executable, "-m", "taskdata", "cache", "--task", "toy_random", "--module", MODULE, "--output",
               f"gs://{BUCKET}/cache", "--num-shards", "3", "--quiet", "--", *dask_args(cluster)]
    done = subprocess.run(command, env=emulator_env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    version_dir = done.stdout.strip().splitlines()[-1]
    assert version_dir.startswith(f"gs://{BUCKET}/cache/toy_random/v")
    listed = subprocess.run([sys.executable, "-c", _GS_DIGESTS, version_dir], env=emulator_env, cwd=REPO,
                            capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(listed.stdout) == {name: hashlib.sha256(data).hexdigest() for name, data in reference.items()}


def test_runner_dask_without_an_address_is_refused_in_one_line(capsys, tmp_path):
    _require_dask()
    from taskdata.cli import main

    code = main(["cache", "--task", "toy_det", "--module", MODULE, "--output", str(tmp_path), "--", "--runner=dask"])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("taskdata cache: error: --runner=dask needs the Dask scheduler's address: add "
                            "--dask_client_address=tcp://HOST:8786"), error
    assert "\n" not in error and not list(tmp_path.rglob("v*"))


def test_an_unreachable_scheduler_fails_the_job_in_one_line_before_it_writes_anything(capsys, tmp_path):
    _require_dask()
    from taskdata.cli import main

    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    code = main(["cache", "--task", "toy_det", "--module", MODULE, "--output", str(tmp_path), "--quiet", "--",
                 "--runner=dask", f"--dask_client_address={address}", "--dask_connection_timeout=2"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 3 and error.startswith(f"taskdata cache: error: Cache build of task 'toy_det' cannot start: Cannot "
                                          f"reach the Dask scheduler at {address} within 2 s"), error
    assert list_versions(str(tmp_path / "toy_det")) == []


def test_a_scheduler_without_workers_fails_the_job_instead_of_waiting_forever(tmp_path):
    _require_dask()
    with dask_cluster(0, tmp_path / "cluster") as empty, pytest.raises(
            CacheJobError, match=rf"The Dask scheduler at {empty.address} has no workers \(waited 2 s\)"):
        build3(tmp_path / "out", beam_args=dask_args(empty, "--dask_connection_timeout=2"))
    assert list_versions(str(tmp_path / "out" / "toy_random")) == []


def test_workers_that_cannot_load_the_task_or_see_the_output_are_named(cluster, tmp_path, monkeypatch):
    from taskdata.beam import runners
    from taskdata.beam.pipeline import CacheJobSpec

    # A task module that only the launcher can import: the workers cannot run its task.
    (tmp_path / "launcher_only_tasks.py").write_text(
        "from tests.cache_tasks import FEATURES, EncodeText, SPLITS, synthetic_documents\n"
        "from taskdata.define.task import Task\nfrom taskdata.sources import FunctionSource\n"
        "def register_tasks(registry):\n"
        "    registry.add(Task('launcher_only', FunctionSource(synthetic_documents, SPLITS), [EncodeText()], FEATURES))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry()
    registry.load_module("launcher_only_tasks")
    options = CacheOptions(task="launcher_only", output=str(tmp_path / "out"), modules=("launcher_only_tasks",),
                           beam_args=tuple(dask_args(cluster)), progress=False)
    with pytest.raises(CacheJobError, match=r"cannot start: 2 of the 2 Dask workers cannot run this job: worker "
                                            r"tcp://127\.0\.0\.1:\d+: ModuleNotFoundError: .*launcher_only_tasks"):
        run_cache_job(options, registry, log=lambda m: None)
    assert list_versions(str(tmp_path / "out" / "launcher_only")) == []

    # Workers that cannot see the folder the job writes (another machine's local disk, say).
    registry.load_module(MODULE)
    spec = CacheJobSpec(task="toy_random", task_fingerprint=registry.get_task("toy_random").fingerprint(),
                        modules=(MODULE,), config=Config().to_tuple(), seed=0, version_dir=str(tmp_path / "v"),
                        tmp_dir=str(tmp_path / "v" / "_tmp"), num_shards=(("train", 3),))
    probe = str(tmp_path / "not-on-the-workers" / ".write-probe")
    pipeline_options = runners.pipeline_options(dask_args(cluster), 8)
    with pytest.raises(runners.ClusterError, match=rf"FileNotFoundError: .* cannot see {probe}"):
        runners.check_dask_cluster(pipeline_options, spec, probe)


def test_a_task_that_kills_every_worker_it_runs_on_fails_the_job_in_one_line(cluster, tmp_path, monkeypatch, capsys):
    from taskdata.cli import main

    # The workers import task modules from their folder too (python -m puts it first on their path).
    (cluster.cwd / "worker_killer_tasks.py").write_text(
        "import os, signal\n"
        "from taskdata.define.task import Task\nfrom taskdata.sources import FunctionSource\n"
        "from tests.cache_tasks import FEATURES, EncodeText\n"
        "def documents(split, shard):\n"
        "    if shard == '1':\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    yield {'text': f'{split} {shard}'}\n"
        "def register_tasks(registry):\n"
        "    registry.add(Task('kills_its_worker', FunctionSource(documents, {'train': ['0', '1']}), [EncodeText()],\n"
        "                      FEATURES))\n")
    monkeypatch.syspath_prepend(str(cluster.cwd))
    try:
        code = main(["cache", "--task", "kills_its_worker", "--module", "worker_killer_tasks", "--output",
                     str(tmp_path), "--num-shards", "2", "--quiet", "--", *dask_args(cluster)])
    finally:
        cluster.wait_for_workers(2)  # the nannies restart them, for the tests that follow
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("[cache]")]
    # The job's one line, then the line every failed build ends with (the partial version is never read).
    assert code == 3 and len(lines) == 2 and lines[1].startswith("The partial version "), err
    assert lines[0].startswith("taskdata cache: error: Cache build of task 'kills_its_worker' failed in the Beam "
                               "pipeline: Attempted to run task"), lines[0]
    assert "on 4 different workers, but all those workers died while running it" in lines[0]
    [version] = list_versions(str(tmp_path / "kills_its_worker"))
    assert not (tmp_path / "kills_its_worker" / version / "COMPLETED").exists()
    assert not (tmp_path / "kills_its_worker" / "CURRENT").exists()


def test_a_scheduler_that_dies_mid_job_fails_it_in_one_line_and_nothing_is_committed(tmp_path):
    _require_dask()
    output = tmp_path / "out"
    with dask_cluster(1, tmp_path / "cluster") as doomed:
        # The client gives up on a lost scheduler after Dask's connect timeout (30 s; 5 here).
        env = dict(os.environ, DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="5")
        job = subprocess.Popen([sys.executable, "-m", "taskdata", "cache", "--task", "drill_docs", "--module",
                                "deploy.fault_drills._tasks", "--output", str(output), "--num-shards", "3", "--quiet",
                                "--", *dask_args(doomed)],
                               env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        # Once the first of its 10 source shards is done, the job's tasks are on the cluster.
        while not list(output.glob("drill_docs/v*/_tmp/results/sources/*.json")):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.02)
        doomed.processes[0].kill()  # the scheduler
        _, stderr = job.communicate(timeout=300)
    errors = [line for line in stderr.splitlines() if line.startswith("taskdata cache: error: ")]
    assert job.returncode == 3 and len(errors) == 1 and "Traceback" not in stderr, stderr
    assert errors[0].startswith("taskdata cache: error: Cache build of task 'drill_docs' failed in the Beam pipeline: "
                                "The Dask cluster lost the job: its result is cancelled, not finished. Did the "
                                f"scheduler at {doomed.address} stop?"), errors[0]
    assert not list(output.rglob("COMPLETED")) and not (output / "drill_docs" / "CURRENT").exists()


def test_the_fault_runner_finds_the_dask_drills():
    from deploy import faults

    assert {"dask-sigkill-preprocessing", "dask-sigkill-writing"} <= {name for name, _ in faults.drills()}


def test_a_worker_killed_while_it_writes_a_shard_costs_a_retry_not_the_cache():
    """The drill of RELIABILITY.md ('Dask'), one kill on a smaller corpus: the job completes with the unkilled
    build's bytes, or fails in one line leaving nothing complete; verify and the next job agree."""
    _require_dask()
    from deploy.fault_drills import dask_workers

    counts = dask_workers.sigkill_worker("writing", kills=1, max_rounds=3, documents=3000)
    assert counts["ok"] is True, counts
