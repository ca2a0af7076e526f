"""Dask drills: a worker of a real local Dask cluster SIGKILLed while the cache job runs on it.

A scheduler and two workers (each under its nanny, which starts a new worker process when one dies, as a cluster
manager replaces a lost machine) run as separate processes (``deploy/dask_cluster.py``); the job is ``taskdata
cache --task drill_c4 ... -- --runner=dask``, on a corpus of C4-format files (``deploy/fault_drills/_tasks.py``),
into a fresh output folder each round. A round kills exactly one worker process, chosen by what it holds open:

- ``dask-sigkill-preprocessing``: a worker reading one of the corpus files (preprocessing a source shard);
- ``dask-sigkill-writing``: a worker writing an output shard (its temporary file under the version's ``_tmp``).

Then the job must either complete with bytes identical to an unkilled build, or fail with one error line
(``taskdata cache: error: ...``, then the line that says the partial version is never read, as every failed build
ends) and leave no version marked complete; ``taskdata verify`` of the task and the
next ``taskdata cache`` (without ``--force``) must agree: verify passes exactly when the next job reuses the killed
job's version, and whatever the next job leaves is byte-identical to the unkilled build.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = str(Path(__file__).resolve().parent.parent.parent)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from deploy.dask_cluster import DaskCluster, dask_cluster  # noqa: E402
from deploy.fault_drills._tasks import C4_DIR_ENV  # noqa: E402
from taskdata.cache.lease import lease_path  # noqa: E402

__all__ = ["DRILLS", "sigkill_worker"]

MODULE = "deploy.fault_drills._tasks"
TASK = "drill_c4"
PHASES = ("preprocessing", "writing")
# Train documents of the drills' corpus (6 train files, 2 validation files of 30% as many documents): on 2 shared
# cores a source shard then takes about a second to preprocess and an output shard about as long to write, windows
# that a 5 ms poll does not miss.
DOCUMENTS = 10_000


def _cache(output: Path, cluster: DaskCluster, *extra: str) -> list[str]:
    return [sys.executable, "-m", "taskdata", "cache", "--task", TASK, "--module", MODULE, "--output", str(output),
            "--num-shards", "3", "--quiet", *extra, "--", "--runner=dask", f"--dask_client_address={cluster.address}"]


def _files_of(version_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(version_dir)): p.read_bytes() for p in sorted(version_dir.rglob("*")) if p.is_file()}


def _open_files(pid: int) -> list[str]:
    names = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                names.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return names


def _victim(pids: dict[str, int], phase: str, corpus: Path, output: Path) -> tuple[int, str] | None:
    """(pid, file) of a worker holding open what marks ``phase``, if one does now. Only once the job holds its
    version's lease: before that, in the job's check of the cluster, workers may read the corpus to hash it."""
    if not any(Path(lease_path(str(v))).exists() for v in (output / TASK).glob("v*")):
        return None
    for pid in pids.values():
        for name in _open_files(pid):
            if phase == "preprocessing" and name.startswith(str(corpus) + "/"):
                return pid, name
            if phase == "writing" and name.startswith(str(output) + "/") and "/_tmp/writing/" in name:
                return pid, name
    return None


def _run(command: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _round(cluster: DaskCluster, phase: str, corpus: Path, output: Path, env: dict[str, str],
           reference: dict[str, bytes]) -> dict[str, int | str]:
    """One killed build and what follows it; the figures of the round (ints are counts, 0 or 1)."""
    cluster.wait_for_workers(2)
    pids = cluster.worker_pids()
    started = time.monotonic()
    job = subprocess.Popen(_cache(output, cluster), env=env, cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    victim = None
    while job.poll() is None and victim is None:
        victim = _victim(pids, phase, corpus, output)
        if victim is None:
            time.sleep(0.005)
    if victim is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim[0], signal.SIGKILL)
    try:
        _, stderr = job.communicate(timeout=600)
        job_seconds = time.monotonic() - started
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        return {"killed": int(victim is not None), "hung": 1}
    task_root = output / TASK
    complete = [p.parent for p in task_root.glob("v*/COMPLETED")]
    errors = [line for line in stderr.splitlines() if line.startswith("taskdata cache: error: ")]
    figures: dict[str, int | str] = {
        "killed": int(victim is not None), "hung": 0, "completed": int(job.returncode == 0),
        # The job's error line, and no traceback (every failed build adds a line saying its version is never read).
        "failed_with_one_line": int(job.returncode != 0 and len(errors) == 1 and "Traceback" not in stderr),
        "complete_looking_after_failure": int(job.returncode != 0 and bool(complete)),
        "completed_byte_identical": int(job.returncode == 0 and len(complete) == 1
                                        and _files_of(complete[0]) == reference),
    }
    if errors:
        figures["error"] = errors[0]
    if victim is not None:
        figures.update(job_seconds=round(job_seconds, 1), held=victim[1].rsplit("/", 1)[-1].split(".tmp-")[0])
    verify = _run([sys.executable, "-m", "taskdata", "verify", str(task_root)], env)
    following = _run(_cache(output, cluster), env)
    reused = "reusing complete cache" in following.stderr
    current = Path(following.stdout.strip().splitlines()[-1]) if following.returncode == 0 else None
    figures.update(
        verify_passed=int(verify.returncode == 0),
        next_cache_reused=int(reused),
        verify_and_next_cache_agree=int((verify.returncode == 0) == reused == (job.returncode == 0)),
        next_cache_byte_identical=int(current is not None and _files_of(current) == reference),
    )
    return figures


@contextlib.contextmanager
def _drill_cluster(work: Path, documents: int) -> Iterator[tuple[DaskCluster, Path, dict[str, str]]]:
    from taskdata.tasks.corpus import build_corpus

    corpus = work / "corpus"
    build_corpus(str(corpus), num_train_docs=documents, num_validation_docs=max(200, documents * 3 // 10),
                 train_files=6, validation_files=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKDATA_")}
    env.update(PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""), TASKDATA_HOME=str(work / "home"),
               **{C4_DIR_ENV: str(corpus)})
    with dask_cluster(2, work / "workers", env) as cluster:
        yield cluster, corpus, env


def sigkill_worker(phase: str, kills: int = 10, max_rounds: int | None = None, documents: int = DOCUMENTS) -> dict:
    """``kills`` rounds in which a worker is SIGKILLed during ``phase`` (``preprocessing`` or ``writing``), on a
    corpus of ``documents`` train documents."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES} but got {phase!r}")
    with tempfile.TemporaryDirectory(prefix=f"taskdata-dask-{phase}-") as folder:
        work = Path(folder)
        with _drill_cluster(work, documents) as (cluster, corpus, env):
            started = time.monotonic()
            unkilled = _run(_cache(work / "reference", cluster), env)
            if unkilled.returncode != 0:
                raise RuntimeError(f"the unkilled build failed: {unkilled.stderr[-2000:]}")
            unkilled_seconds = time.monotonic() - started
            reference = _files_of(Path(unkilled.stdout.strip().splitlines()[-1]))
            rounds: list[dict[str, int | str]] = []
            seconds: list[float] = []
            while sum(int(r["killed"]) for r in rounds) < kills and len(rounds) < (max_rounds or 2 * kills):
                started = time.monotonic()
                rounds.append(_round(cluster, phase, corpus, work / f"round{len(rounds)}", env, reference))
                seconds.append(time.monotonic() - started)
    killed = [r for r in rounds if r["killed"]]
    counts = {key: sum(int(r.get(key, 0)) for r in killed) for key in (
        "killed", "hung", "completed", "completed_byte_identical", "failed_with_one_line",
        "complete_looking_after_failure", "verify_passed", "next_cache_reused", "verify_and_next_cache_agree",
        "next_cache_byte_identical")}
    counts["rounds"] = len(rounds)
    counts["errors"] = sorted({str(r["error"]) for r in killed if "error" in r})
    counts["unkilled_build_seconds"] = round(unkilled_seconds, 1)
    counts["killed_job_seconds"] = [r["job_seconds"] for r in killed if "job_seconds" in r]
    counts["killed_round_seconds"] = [round(s, 1) for s, r in zip(seconds, rounds, strict=True) if r["killed"]]
    counts["killed_holding"] = sorted(str(r["held"]) for r in killed if "held" in r)
    n = counts["killed"]
    counts["ok"] = (n == kills and counts["hung"] == 0 and counts["complete_looking_after_failure"] == 0
                    and counts["completed"] == counts["completed_byte_identical"]
                    and counts["completed"] + counts["failed_with_one_line"] == n
                    and counts["verify_and_next_cache_agree"] == n and counts["next_cache_byte_identical"] == n)
    return counts


def sigkill_while_preprocessing(kills: int = 10) -> dict:
    return sigkill_worker("preprocessing", kills)


def sigkill_while_writing(kills: int = 10) -> dict:
    return sigkill_worker("writing", kills)


DRILLS = [("dask-sigkill-preprocessing", sigkill_while_preprocessing), ("dask-sigkill-writing", sigkill_while_writing)]
