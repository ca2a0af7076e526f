"""The end-to-end drill: corpus on GCS -> cache -> plan -> server -> preempted, elastic training
-> validation predictions -> eval, each step run the way a user deploys it (the CLI and the trainer as
separate processes, every path on ``gs://``).

    python deploy/drill.py --work-dir /tmp/drill                  # small defaults, about a minute
    python deploy/drill.py --train-docs 20000 --steps 200 --batch-size 32

Stages, each printed with its duration; a failure raises ``DrillError`` naming the stage:

  storage          a GCS emulator on 127.0.0.1 (free port); a C4-format corpus (``build_corpus``) built
                   locally and uploaded to gs://BUCKET/c4/en/.
  vocabulary       ``taskdata vocab train`` on that corpus, written to gs://BUCKET/vocab/; every later
                   process gets it as $TASKDATA_VOCAB (otherwise the built-in tasks would train one on
                   the 24,000-document built-in corpus first).
  cache            ``taskdata cache --task c4_span_corruption --c4-dir gs://.../c4/en --output
                   gs://.../cache -- --direct_running_mode=multi_processing --direct_num_workers=2``,
                   ``taskdata verify``, and the same build from the local copy into a local folder:
                   every file of the two version folders must be byte-identical.
  serve            ``taskdata plan`` stores the run in the bucket; ``taskdata serve --cache-root
                   gs://.../cache --token-file F`` reads caches and plans from it; /healthz answers, a
                   request without the token is refused and one with it sees the planned run.
  train-reference  one trainer process trains the whole run from the server (the reference batch log).
  train-preempted  four trainer processes (jax.distributed on 127.0.0.1) train from the server; one is
                   SIGKILLed once step ``kill_at_step`` is logged; every other one must exit on its own
                   within 60 s, non-zero, saying which process stopped and how to resume (when the
                   killed one is process 0, JAX aborts them itself, with its own message; a survivor that
                   gloo aborts on a collective mismatch, SIGABRT before its Python code runs, is named in
                   the report, and at least one other survivor must still say it).
  train-resumed    two trainer processes resume from the last checkpoint to the end and write validation
                   predictions to gs://BUCKET/predictions/; the combined batch log (last write per step
                   wins, as in the client's tests) must equal the reference's, step for step.
  eval             ``taskdata eval c4_span_corruption --split validation --cache gs://.../cache
                   --predictions gs://.../predictions/... --allow-partial --c4-dir gs://.../c4/en
                   --output gs://.../eval/...``: the report must score exactly the predicted examples.

Every process the drill starts gets its own process group, is recorded by its pid, and is stopped
through that id (SIGTERM, then SIGKILL) when its stage no longer needs it and, whatever happens, in a
``finally``; every wait has a deadline (``--stage-timeout``); polling is at fixed intervals until it.

What the emulator cannot show: it has no authentication. On GCS the trainers and the server would hold
read-only credentials for the bucket (only the cache job, ``taskdata plan`` and the trainer's
prediction writer need to write); the emulator accepts any request, so this drill does not check that
readers cannot write, and it does not pretend to. Nor does it honour generation preconditions
(``ifGenerationMatch``), so writers racing on shared state are drilled on fake-gcs-server instead
(``deploy/fault_drills/shared_state.py``); here each piece of shared state has one writer at a time. The bearer token of the assignment server is real
and is checked.

The drill's own process never changes its environment: every child gets an environment built here
(the emulator's address, ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` so that gcsfs does not probe
gRPC for a minute, ``$TASKDATA_HOME`` inside the work folder, no inherited ``TASKDATA_*``), and the
drill's own gcsfs client is pointed at the emulator explicitly.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)  # run as a script from a checkout: the package need not be installed

__all__ = ["STAGES", "DrillConfig", "DrillError", "DrillReport", "StageResult", "main", "run_drill"]

STAGES = (
    "storage",
    "vocabulary",
    "cache",
    "serve",
    "train-reference",
    "train-preempted",
    "train-resumed",
    "eval",
)
TASK = "c4_span_corruption"
RUN = "drill"
HOSTS, RESUME_HOSTS = 4, 2
EXTRA_IDS = 100  # the built-in tasks' vocabularies add T5's 100 sentinels to the SentencePiece pieces
MODEL_ARGS = ("--d-model", "16", "--num-heads", "2", "--head-dim", "8", "--d-ff", "32")
BEAM_ARGS = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")
POLL_SECONDS = 0.05
GRACE_SECONDS = 10.0  # for a process asked to stop with SIGTERM
SURVIVOR_SECONDS = 60.0  # for every other trainer to exit on its own after one was killed


class DrillError(RuntimeError):
    """A stage that did not do what it should; ``stage`` names it."""

    def __init__(self, stage: str, message: str):
        super().__init__(f"drill stage {stage!r} failed: {message}")
        self.stage = stage


def _check_positive(owner: str, **values: Any) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"{owner} {name} must be a positive number but got {value!r}.")


@dataclasses.dataclass(frozen=True)
class DrillConfig:
    """Sizes of the drill. ``kill_at_step`` defaults to half of ``steps``."""

    work_dir: str
    train_docs: int = 2000
    validation_docs: int = 100
    vocab_size: int = 1000
    steps: int = 24
    batch_size: int = 8
    checkpoint_every: int = 4
    kill_at_step: int | None = None
    kill_process: int = 1
    predict_examples: int = 16
    stage_timeout: float = 300.0
    bucket: str = "taskdata-drill"
    seed: int = 0

    def __post_init__(self) -> None:
        _check_positive(
            "DrillConfig",
            train_docs=self.train_docs,
            validation_docs=self.validation_docs,
            vocab_size=self.vocab_size,
            steps=self.steps,
            batch_size=self.batch_size,
            checkpoint_every=self.checkpoint_every,
            predict_examples=self.predict_examples,
            stage_timeout=self.stage_timeout,
        )
        if self.train_docs < 4 or self.validation_docs < 2:
            raise ValueError(
                f"DrillConfig needs at least 4 train and 2 validation documents (one per corpus file) but got "
                f"{self.train_docs} and {self.validation_docs}."
            )
        if self.batch_size % HOSTS:
            raise ValueError(
                f"DrillConfig batch_size must be a multiple of {HOSTS} (the run has {HOSTS} data shards, one "
                f"per host of the preempted job) but got {self.batch_size}."
            )
        kill = self.kill_step
        if not self.checkpoint_every <= kill < self.steps - 1:
            raise ValueError(
                f"DrillConfig kill_at_step must be at least checkpoint_every ({self.checkpoint_every}), so that "
                f"a checkpoint exists when the process is killed, and below steps - 1 ({self.steps - 1}), so "
                f"that the kill comes before the end; got {kill}. Raise steps or lower checkpoint_every."
            )
        if not 0 <= self.kill_process < HOSTS:
            raise ValueError(f"DrillConfig kill_process must be in [0, {HOSTS}) but got {self.kill_process}.")
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]", self.bucket):
            raise ValueError(
                f"DrillConfig bucket {self.bucket!r} is not a valid bucket name (a-z, 0-9, '-', '_')."
            )

    @property
    def kill_step(self) -> int:
        return self.steps // 2 if self.kill_at_step is None else self.kill_at_step


@dataclasses.dataclass(frozen=True)
class StageResult:
    name: str
    seconds: float
    detail: str

    def __post_init__(self) -> None:
        if self.name not in STAGES:
            raise ValueError(f"Unknown drill stage {self.name!r}; the stages are {STAGES}.")


@dataclasses.dataclass(frozen=True)
class DrillReport:
    """What the drill established, stage by stage, and every pid it started (all stopped)."""

    work_dir: str
    stages: tuple[StageResult, ...]
    pids: tuple[int, ...]
    facts: dict[str, Any]

    def __post_init__(self) -> None:
        names = tuple(stage.name for stage in self.stages)
        if names != STAGES:
            raise ValueError(f"A drill report holds every stage in order {STAGES}, not {names}.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return "(no log)"
    return text[-chars:]


class _Processes:
    """Child processes by pid, each in its own process group (so Beam's workers go with their job)."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.started: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}

    def log_path(self, name: str) -> str:
        return os.path.join(self.log_dir, f"{name}.log")

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log_path(name), "ab") as log:
            process = subprocess.Popen(
                list(argv),
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started[process.pid] = (name, process)
        return process

    def name(self, process: subprocess.Popen[bytes]) -> str:
        return self.started[process.pid][0]

    def wait(self, process: subprocess.Popen[bytes], deadline: float) -> int:
        try:
            return process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop(process)
            name = self.name(process)
            raise TimeoutError(
                f"{name} (pid {process.pid}) did not finish before the stage's deadline (raise --stage-timeout "
                f"on a slow machine); log {self.log_path(name)}:\n{_tail(self.log_path(name))}"
            ) from None

    def run(self, name: str, argv: Sequence[str], env: dict[str, str], deadline: float) -> str:
        """Runs a command to completion; its output, or an error with the log's tail."""
        process = self.start(name, argv, env)
        code = self.wait(process, deadline)
        output = _tail(self.log_path(name), 1 << 20)
        if code != 0:
            raise RuntimeError(
                f"{name} exited {code}: {' '.join(argv)}\nlog {self.log_path(name)}:\n{output[-3000:]}"
            )
        return output

    def check_exit(self, process: subprocess.Popen[bytes], deadline: float) -> None:
        code = self.wait(process, deadline)
        if code != 0:
            name = self.name(process)
            raise RuntimeError(
                f"{name} (pid {process.pid}) exited {code}; log:\n{_tail(self.log_path(name))}"
            )

    def stop(self, process: subprocess.Popen[bytes], *, term_first: bool = True) -> None:
        """SIGTERM to the process group whose id is the pid, SIGKILL after a grace period (or at once).

        A process that was already reaped is left alone: its pid may belong to another process by now.
        Otherwise the leader is reaped only after the last SIGKILL to its group, so the group id cannot
        have been reused when it is sent.
        """
        if process.returncode is not None:
            return
        for signum in (signal.SIGTERM, signal.SIGKILL) if term_first else (signal.SIGKILL,):
            os.killpg(process.pid, signum)
            if _exited(process.pid, GRACE_SECONDS):
                break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # members that outlived their leader (a job's workers)
        process.wait()

    def stop_all(self) -> None:
        for _, process in reversed(list(self.started.values())):
            self.stop(process)


def _exited(pid: int, seconds: float) -> bool:
    """Whether ``pid`` exits within ``seconds``, without reaping it (so its pid stays reserved)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(POLL_SECONDS)
    return False


def _poll(
    what: str, check: Callable[[], bool], deadline: float, alive: Callable[[], str | None] = lambda: None
) -> None:
    """Calls ``check`` every POLL_SECONDS until it is true; fails at ``deadline`` or when ``alive`` says why."""
    while True:
        if check():
            return
        problem = alive()
        if problem:
            raise RuntimeError(f"while waiting for {what}: {problem}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not happen before the stage's deadline (raise --stage-timeout).")
        time.sleep(POLL_SECONDS)


def _http_status(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


class _Drill:
    def __init__(self, config: DrillConfig):
        self.config = config
        self.work = os.path.abspath(config.work_dir)
        os.makedirs(os.path.join(self.work, "logs"), exist_ok=True)
        self.processes = _Processes(os.path.join(self.work, "logs"))
        self.deadline = 0.0
        self.facts: dict[str, Any] = {}
        self.env: dict[str, str] = {}
        self.gcs: Any = None
        self.emulator_url = ""
        self.server_url = ""
        self.token_file = os.path.join(self.work, "server-token")
        bucket = f"gs://{config.bucket}"
        self.c4_dir = f"{bucket}/c4/en"
        self.vocab = f"{bucket}/vocab/drill-{config.vocab_size}.model"
        self.cache_root = f"{bucket}/cache"
        self.predictions = f"{bucket}/predictions/{RUN}-validation.jsonl"
        self.eval_report = f"{bucket}/eval/{RUN}-validation.json"
        self.lengths = {"inputs": 0, "targets": 0}

    # --- helpers ------------------------------------------------------------------------------------

    def _taskdata(self, name: str, *args: str) -> str:
        return self.processes.run(name, [sys.executable, "-m", "taskdata", *args], self.env, self.deadline)

    def _gcs_path(self, url: str) -> str:
        return url.removeprefix("gs://")

    def _trainer_args(self, out: str, *, predictions: bool) -> list[str]:
        c = self.config
        args = [
            "--server", self.server_url, "--token-file", self.token_file, "--run", RUN,
            "--retry-seconds", str(int(c.stage_timeout)),
            "--steps", str(c.steps), "--checkpoint-every", str(c.checkpoint_every),
            "--checkpoint-dir", os.path.join(out, "ckpt"), "--log", os.path.join(out, "batches.jsonl"),
            "--inputs-length", str(self.lengths["inputs"]), "--targets-length", str(self.lengths["targets"]),
            "--compilation-cache", os.path.join(self.work, "jax-cache"),
            "--vocab-size", str(c.vocab_size + EXTRA_IDS), *MODEL_ARGS,
        ]  # fmt: skip
        if predictions:
            args += [
                "--predictions-out", self.predictions,
                "--predict-split", "validation", "--predict-examples", str(c.predict_examples),
            ]  # fmt: skip
        return args

    def _start_trainers(self, label: str, count: int, args: list[str]) -> list[subprocess.Popen[bytes]]:
        base = [sys.executable, "-m", "trainer_client.example.train", *args]
        if count == 1:
            return [self.processes.start(f"{label}.0", base, self.env)]
        coordinator = f"127.0.0.1:{_free_port()}"
        return [
            self.processes.start(
                f"{label}.{i}",
                [*base, "--coordinator", coordinator, "--num-processes", str(count), "--process-id", str(i),
                 "--init-timeout", str(int(self.config.stage_timeout))],
                self.env,
            )
            for i in range(count)
        ]  # fmt: skip

    # --- stages -------------------------------------------------------------------------------------

    def storage(self) -> str:
        from gcsfs.core import GCSFileSystem

        from taskdata.tasks.corpus import build_corpus

        c = self.config
        binary = shutil.which(
            "gcp-storage-emulator",
            path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        )
        if binary is None:
            raise FileNotFoundError(
                "gcp-storage-emulator is not installed beside this Python or on PATH; install the test extra "
                "(pip install -e '.[test]') or 'pip install gcp-storage-emulator'."
            )
        port = _free_port()
        self.emulator_url = f"http://127.0.0.1:{port}"
        emulator = self.processes.start(
            "gcs-emulator",
            [
                binary,
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--default-bucket",
                c.bucket,
                "--in-memory",
            ],
            dict(os.environ),
        )
        bucket_url = f"{self.emulator_url}/storage/v1/b/{c.bucket}"
        _poll(
            f"the GCS emulator (pid {emulator.pid}) to serve bucket {c.bucket}",
            lambda: _http_status(bucket_url)[0] == 200,
            self.deadline,
            lambda: (
                None
                if emulator.poll() is None
                else f"it exited: {_tail(self.processes.log_path('gcs-emulator'))}"
            ),
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TASKDATA_")}
        self.env.update(
            STORAGE_EMULATOR_HOST=self.emulator_url,
            GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
            TASKDATA_HOME=os.path.join(self.work, "taskdata-home"),
            PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
            JAX_PLATFORMS="cpu",
            XLA_FLAGS="--xla_force_host_platform_device_count=1",
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        self.gcs = GCSFileSystem(token="anon", endpoint_url=self.emulator_url, skip_instance_cache=True)
        corpus = os.path.join(self.work, "corpus")
        build_corpus(
            corpus,
            num_train_docs=c.train_docs,
            num_validation_docs=c.validation_docs,
            train_files=min(4, c.train_docs),
            validation_files=2,
        )
        names = sorted(n for n in os.listdir(corpus) if n.startswith("c4-"))
        for name in names:
            self.gcs.put_file(os.path.join(corpus, name), f"{self._gcs_path(self.c4_dir)}/{name}")
        uploaded = sorted(p.rsplit("/", 1)[-1] for p in self.gcs.ls(self._gcs_path(self.c4_dir)))
        if uploaded != names:
            raise RuntimeError(f"uploaded {names} to {self.c4_dir} but the bucket lists {uploaded}.")
        self.facts["corpus"] = {
            "files": names,
            "train_docs": c.train_docs,
            "validation_docs": c.validation_docs,
        }
        return (
            f"emulator pid {emulator.pid} at {self.emulator_url}; {len(names)} corpus files in {self.c4_dir}"
        )

    def vocabulary(self) -> str:
        c = self.config
        self._taskdata(
            "vocab-train", "vocab", "train", "--task", TASK, "--c4-dir", self.c4_dir,
            "--size", str(c.vocab_size), "--out", self.vocab,
        )  # fmt: skip
        if not self.gcs.exists(self._gcs_path(self.vocab)):
            raise RuntimeError(f"'taskdata vocab train' succeeded but {self.vocab} does not exist.")
        self.env["TASKDATA_VOCAB"] = self.vocab
        return f"{c.vocab_size} pieces (+{EXTRA_IDS} sentinels) at {self.vocab}"

    def cache(self) -> str:
        c = self.config
        common = ["cache", "--task", TASK, "--seed", str(c.seed), "--quiet"]
        self._taskdata(
            "cache-gcs", *common, "--c4-dir", self.c4_dir, "--output", self.cache_root, "--", *BEAM_ARGS
        )
        task_root = f"{self._gcs_path(self.cache_root)}/{TASK}"
        version = self.gcs.cat(f"{task_root}/CURRENT").decode().strip()
        self._taskdata("verify", "verify", f"{self.cache_root}/{TASK}")
        local_root = os.path.join(self.work, "local-cache")
        local_corpus = os.path.join(self.work, "corpus")
        self._taskdata(
            "cache-local", *common, "--c4-dir", local_corpus, "--output", local_root, "--", *BEAM_ARGS
        )
        with open(os.path.join(local_root, TASK, "CURRENT")) as f:
            local_version_dir = os.path.join(local_root, TASK, f.read().strip())
        remote_dir = f"{task_root}/{version}"
        remote = {p[len(remote_dir) + 1 :]: p for p in self.gcs.find(remote_dir)}
        local = {
            os.path.relpath(os.path.join(d, n), local_version_dir): os.path.join(d, n)
            for d, _, files in os.walk(local_version_dir)
            for n in files
        }
        if sorted(remote) != sorted(local):
            raise RuntimeError(
                f"gs:// version {remote_dir} holds files {sorted(set(remote) ^ set(local))} that the local "
                f"version {local_version_dir} does not, or the other way round."
            )
        differing = []
        for name in sorted(local):
            with open(local[name], "rb") as f:
                if f.read() != self.gcs.cat(remote[name]):
                    differing.append(name)
        if differing:
            raise RuntimeError(
                f"the cache built from gs:// differs from the one built from the local corpus in {differing} "
                f"({remote_dir} vs {local_version_dir}): the build is not deterministic across file systems."
            )
        manifest = json.loads(self.gcs.cat(f"{remote_dir}/manifest.json"))
        self.lengths = {k: int(manifest["sequence_length"][k]) for k in ("inputs", "targets")}
        self.facts["cache"] = {
            "version": version,
            "identical_files": len(local),
            "records": {s: v["num_records"] for s, v in manifest["splits"].items()},
        }
        records = ", ".join(f"{s} {n}" for s, n in self.facts["cache"]["records"].items())
        return f"{version}: {records} records; {len(local)} files byte-identical to the local build"

    def serve(self) -> str:
        c = self.config
        output = self._taskdata(
            "plan", "plan", "--name", RUN, "--mixture", TASK, "--cache-root", self.cache_root, "--seed", str(c.seed),
            "--batch-size", str(c.batch_size), "--num-data-shards", str(HOSTS),
            "--c4-dir", self.c4_dir,  # the task as the cache was built: plan refuses a cache of another definition
        )  # fmt: skip
        match = re.search(r"fingerprint ([0-9a-f]{64})", output)
        if match is None:
            raise RuntimeError(f"'taskdata plan' did not state the run's fingerprint:\n{output[-2000:]}")
        fingerprint = match.group(1)
        if not self.gcs.exists(f"{self._gcs_path(self.cache_root)}/_runs/{RUN}.json"):
            raise RuntimeError(
                f"'taskdata plan' did not store the run at {self.cache_root}/_runs/{RUN}.json."
            )
        token = secrets.token_urlsafe(32)
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        port = _free_port()
        self.server_url = f"http://127.0.0.1:{port}"
        server = self.processes.start(
            "server",
            [sys.executable, "-m", "taskdata", "serve", "--cache-root", self.cache_root, "--token-file",
             self.token_file, "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
            self.env,
        )  # fmt: skip
        _poll(
            f"the server (pid {server.pid}) to answer /healthz",
            lambda: _http_status(f"{self.server_url}/healthz")[0] == 200,
            self.deadline,
            lambda: (
                None if server.poll() is None else f"it exited: {_tail(self.processes.log_path('server'))}"
            ),
        )
        anonymous, _ = _http_status(f"{self.server_url}/runs/{RUN}")
        if anonymous != 401:
            raise RuntimeError(f"GET /runs/{RUN} without the token answered HTTP {anonymous}, not 401.")
        status, body = _http_status(f"{self.server_url}/runs/{RUN}", token)
        if status != 200 or json.loads(body).get("fingerprint") != fingerprint:
            raise RuntimeError(f"GET /runs/{RUN} with the token answered HTTP {status}: {body[:500]!r}")
        self.facts["run"] = {"fingerprint": fingerprint, "server_pid": server.pid}
        return f"run {RUN!r} ({fingerprint[:12]}) stored in the bucket, served at {self.server_url} (token required)"

    def train_reference(self) -> str:
        out = os.path.join(self.work, "reference")
        [trainer] = self._start_trainers("train-reference", 1, self._trainer_args(out, predictions=False))
        self.processes.check_exit(trainer, self.deadline)
        hashes = self._hashes(os.path.join(out, "batches.jsonl"))
        if sorted(hashes) != list(range(self.config.steps)):
            raise RuntimeError(
                f"the reference log holds steps {sorted(hashes)[:5]}..., not 0..{self.config.steps - 1}."
            )
        self.facts["reference"] = hashes
        return f"{self.config.steps} steps, batch {self.config.batch_size}, 1 process"

    def train_preempted(self) -> str:
        from trainer_client.example.batch_log import read_batch_log_lines
        from trainer_client.example.checkpoint import committed_steps

        c = self.config
        out = os.path.join(self.work, "elastic")
        log = os.path.join(out, "batches.jsonl")
        group = self._start_trainers("train-preempted", HOSTS, self._trainer_args(out, predictions=True))

        def logged() -> bool:
            return os.path.exists(log) and any(e["step"] >= c.kill_step for e in read_batch_log_lines(log))

        def all_alive() -> str | None:
            done = [(p.pid, p.poll()) for p in group if p.poll() is not None]
            return f"trainer processes exited before the kill (pid, code): {done}" if done else None

        _poll(f"step {c.kill_step} in {log}", logged, self.deadline, all_alive)
        victim = group[c.kill_process]
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        victim.wait(timeout=GRACE_SECONDS)
        last_logged = max(e["step"] for e in read_batch_log_lines(log))
        # The others are blocked in a collective with the dead process: each must notice and exit by itself.
        exits: dict[int, float] = {}
        while time.monotonic() - killed < SURVIVOR_SECONDS and len(exits) < HOSTS - 1:
            for i, process in enumerate(group):
                if process is not victim and i not in exits and process.poll() is not None:
                    exits[i] = round(time.monotonic() - killed, 1)
            time.sleep(POLL_SECONDS)
        survivors = [p.pid for p in group if p.poll() is None]
        for process in group:
            self.processes.stop(process, term_first=False)
        codes = {i: p.returncode for i, p in enumerate(group)}
        if survivors:
            raise RuntimeError(
                f"trainers {survivors} were still running {SURVIVOR_SECONDS:.0f} s after process {c.kill_process} was "
                f"killed (exit codes {codes}): a lost peer must make every other process exit on its own."
            )
        checkpoints = committed_steps(os.path.join(out, "ckpt"))
        told: list[int] = []
        aborted_by_gloo: list[int] = []
        for i in exits:
            text = _tail(self.processes.log_path(f"train-preempted.{i}"), 1 << 20)
            said = f"process {c.kill_process} of {HOSTS} stopped" in text and "To resume, start every process" in text
            # gloo checks each message against the collective it expects and calls std::terminate on a mismatch
            # (a peer killed mid-collective can leave the survivors in different ones): SIGABRT within
            # milliseconds, before any Python code of the survivor runs. The others must still say it.
            if codes[i] == -signal.SIGABRT and "gloo::EnforceNotMet" in text:
                aborted_by_gloo.append(i)
                continue
            # Process 0 hosts JAX's coordination service: when it dies, JAX aborts the others at once.
            if codes[i] == 0 or (c.kill_process != 0 and not said):
                raise RuntimeError(
                    f"trainer {i} exited {codes[i]} after process {c.kill_process} was killed, without saying which "
                    f"process stopped and how to resume:\n{text[-2000:]}"
                )
            told.append(i)
        if c.kill_process != 0 and not told:
            raise RuntimeError(
                f"after process {c.kill_process} was killed, gloo aborted every other trainer ({aborted_by_gloo}): "
                f"none said which process stopped and how to resume."
            )
        if not checkpoints or checkpoints[-1] >= c.steps:
            raise RuntimeError(
                f"after the kill at step {last_logged} the checkpoints are {checkpoints}: the kill must come after "
                f"a checkpoint and before the end (raise --steps on a fast machine)."
            )
        self.facts["preempted"] = {
            "killed_process": c.kill_process,
            "killed_pid": victim.pid,
            "last_logged_step": last_logged,
            "exit_codes": codes,
            "exit_seconds": exits,
            "aborted_by_gloo": aborted_by_gloo,
            "checkpoint": checkpoints[-1],
        }
        return (
            f"{HOSTS} processes; process {c.kill_process} SIGKILLed after step {last_logged} was logged; the others "
            f"exited on their own after {exits} s with codes {codes}; last checkpoint at step {checkpoints[-1]}"
        )

    def train_resumed(self) -> str:
        c = self.config
        out = os.path.join(self.work, "elastic")
        group = self._start_trainers("train-resumed", RESUME_HOSTS, self._trainer_args(out, predictions=True))
        for process in group:
            self.processes.check_exit(process, self.deadline)
        checkpoint = self.facts["preempted"]["checkpoint"]
        first_log = _tail(self.processes.log_path("train-resumed.0"), 1 << 20)
        if f"resuming at step {checkpoint} " not in first_log:
            raise RuntimeError(f"process 0 did not resume at step {checkpoint}:\n{first_log[-2000:]}")
        from trainer_client.example.batch_log import read_batch_log_lines

        log = os.path.join(out, "batches.jsonl")
        combined = self._hashes(log)
        reference = self.facts["reference"]
        if combined != reference:
            wrong = sorted(s for s in set(combined) | set(reference) if combined.get(s) != reference.get(s))
            raise RuntimeError(
                f"the preempted-and-resumed batch log differs from the reference at steps {wrong[:10]} "
                f"({log} vs {self.work}/reference/batches.jsonl)."
            )
        repeated = len(read_batch_log_lines(log)) - len(combined)
        lines = self.gcs.cat(self._gcs_path(self.predictions)).decode().splitlines()
        validation = self.facts["cache"]["records"]["validation"]
        expected = min(c.predict_examples, validation)
        ids = [json.loads(line)["id"] for line in lines]
        if len(ids) != expected or len(set(ids)) != expected:
            raise RuntimeError(
                f"{self.predictions} holds {len(ids)} lines ({len(set(ids))} ids), not {expected}."
            )
        self.facts["resumed"] = {"from_step": checkpoint, "repeated_steps": repeated, "predictions": expected}
        return (
            f"{RESUME_HOSTS} processes resumed at step {checkpoint}; all {c.steps} batch hashes equal the "
            f"reference (steps trained twice: {repeated}); {expected} predictions at {self.predictions}"
        )

    def eval(self) -> str:
        output = self._taskdata(
            "eval", "eval", TASK, "--split", "validation", "--cache", self.cache_root, "--predictions",
            self.predictions, "--allow-partial", "--c4-dir", self.c4_dir, "--output", self.eval_report,
        )  # fmt: skip
        report = json.loads(self.gcs.cat(self._gcs_path(self.eval_report)))
        validation = self.facts["cache"]["records"]["validation"]
        scored = self.facts["resumed"]["predictions"]
        got = (report.get("num_scored"), report.get("num_missing"), report.get("allow_partial"))
        if got != (scored, validation - scored, True):
            raise RuntimeError(
                f"the eval report says (scored, missing, partial) = {got}, expected {(scored, validation - scored, True)}:"
                f"\n{output[-2000:]}"
            )
        self.facts["eval"] = report
        return f"{scored} of {validation} validation examples scored; report at {self.eval_report}"

    # --- run ----------------------------------------------------------------------------------------

    def _hashes(self, path: str) -> dict[int, str]:
        from trainer_client.example.batch_log import read_batch_log

        return {step: entry["hash"] for step, entry in read_batch_log(path).items()}

    def stage_functions(self) -> list[tuple[str, Callable[[], str]]]:
        functions = [
            self.storage,
            self.vocabulary,
            self.cache,
            self.serve,
            self.train_reference,
            self.train_preempted,
            self.train_resumed,
            self.eval,
        ]
        return list(zip(STAGES, functions, strict=True))


def run_drill(config: DrillConfig, out: Callable[[str], None] = print) -> DrillReport:
    """Runs every stage; raises ``DrillError`` naming the first that fails. Every started process is stopped."""
    drill = _Drill(config)
    results = []
    try:
        for name, function in drill.stage_functions():
            started = time.monotonic()
            drill.deadline = started + config.stage_timeout
            try:
                detail = function()
            except Exception as error:
                raise DrillError(name, f"{type(error).__name__}: {error}") from error
            seconds = time.monotonic() - started
            results.append(StageResult(name, seconds, detail))
            out(f"[drill] {name:<16} {seconds:6.1f} s  {detail}")
    finally:
        drill.processes.stop_all()
    facts = {k: v for k, v in drill.facts.items() if k != "reference"}
    return DrillReport(drill.work, tuple(results), tuple(drill.processes.started), facts)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python deploy/drill.py", description=__doc__.split("\n\n")[0])
    defaults = DrillConfig(work_dir=".")
    p.add_argument("--work-dir", help="folder for the drill's files (default: a new temporary folder, kept)")
    p.add_argument("--train-docs", type=int, default=defaults.train_docs, help="corpus train documents")
    p.add_argument("--validation-docs", type=int, default=defaults.validation_docs)
    p.add_argument("--vocab-size", type=int, default=defaults.vocab_size, help="SentencePiece pieces")
    p.add_argument("--steps", type=int, default=defaults.steps, help="training steps of the run")
    p.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help=f"global batch (multiple of {HOSTS})"
    )
    p.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every)
    p.add_argument(
        "--kill-at-step", type=int, help="SIGKILL a trainer once this step is logged (default steps/2)"
    )
    p.add_argument(
        "--kill-process", type=int, default=defaults.kill_process, help=f"which of the {HOSTS} processes"
    )
    p.add_argument("--predict-examples", type=int, default=defaults.predict_examples)
    p.add_argument("--stage-timeout", type=float, default=defaults.stage_timeout, help="seconds per stage")
    p.add_argument("--bucket", default=defaults.bucket)
    p.add_argument("--seed", type=int, default=defaults.seed)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="taskdata-drill-")
    try:
        config = DrillConfig(
            work_dir=work_dir,
            train_docs=args.train_docs,
            validation_docs=args.validation_docs,
            vocab_size=args.vocab_size,
            steps=args.steps,
            batch_size=args.batch_size,
            checkpoint_every=args.checkpoint_every,
            kill_at_step=args.kill_at_step,
            kill_process=args.kill_process,
            predict_examples=args.predict_examples,
            stage_timeout=args.stage_timeout,
            bucket=args.bucket,
            seed=args.seed,
        )
    except ValueError as error:
        print(f"drill: {error}", file=sys.stderr)
        return 2
    print(f"[drill] work folder {os.path.abspath(work_dir)}", flush=True)
    started = time.monotonic()
    try:
        run_drill(config, out=lambda line: print(line, flush=True))
    except DrillError as error:
        print(f"[drill] FAILED: {error}", file=sys.stderr)
        return 1
    print(f"[drill] passed in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
