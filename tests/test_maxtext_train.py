"""MaxText's own pre-training loop on a taskdata run (``python -m trainer_client.maxtext.train``), in MaxText's
environment (Python 3.12, ``deploy/maxtext_env.sh``), as subprocesses.

One uninterrupted run, and one killed after a checkpoint and restarted on another number of processes: the
global batches (their hashes, as the processes logged them) are the plan's own at every step, the restart
resumes at the step after the checkpoint, and the losses follow the uninterrupted run's. Along the way: the
plan's ramp and skipped steps reach MaxText at its fixed shape with exactly the plan's loss weights (MaxText's
``total_weights``), and MaxText's evals read the validation run again, whole, every time.

Skipped where the MaxText environment is not built; a failure in CI (``CI=true``), whose ``.ci/run`` builds it.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence

import pytest

from taskdata.runs import RunStore
from tests import maxtext_helpers as data
from tests.client_helpers import free_port
from trainer_client.maxtext.batch_log import read_batch_hashes

pytestmark = pytest.mark.slow

STEPS = 24
CHECKPOINT_PERIOD = 8


@pytest.fixture(scope="module")
def maxtext() -> tuple[str, str]:
    python = data.maxtext_python()
    if python is None:
        if os.environ.get("CI") == "true":
            pytest.fail("The MaxText environment is missing: .ci/run builds it with 'bash deploy/maxtext_env.sh'.")
        pytest.skip("The MaxText environment is not built here: run 'bash deploy/maxtext_env.sh' to run these tests.")
    return python, data.maxtext_config(python)


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> str:
    return data.data_root(tmp_path_factory)


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory) -> str:
    """One JAX compilation cache for the module's MaxText runs of one device layout (the restarts skip compiling)."""
    return str(tmp_path_factory.mktemp("jax_cache"))


class Launch:
    """One ``python -m trainer_client.maxtext.train`` process in MaxText's environment, stopped by its pid."""

    def __init__(self, maxtext: tuple[str, str], cache_root: str, folder: str, overrides: Sequence[str], *,
                 devices: int, process: int = 0, processes: int = 1, port: int | None = None,
                 launcher: Sequence[str] = ()):
        python, config = maxtext
        os.makedirs(folder, exist_ok=True)
        self.log_path = os.path.join(folder, f"maxtext_{process}.log")
        hosts = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes), "--process-id",
                 str(process)] if processes > 1 else []
        run = [] if "--run" in launcher else ["--run", data.TRAIN_RUN]
        command = [python, "-m", "trainer_client.maxtext.train", "--cache-root", cache_root, *run,
                   "--batch-log", os.path.join(folder, "batches"), *hosts, *launcher, "--",
                   # The launcher has initialized jax.distributed for several processes; one needs none.
                   config, "hardware=cpu", "skip_jax_distributed_system=true", *data.MODEL, f"steps={STEPS}", f"metrics_file={os.path.join(folder, f'metrics_{process}.jsonl')}",
                   *overrides]
        env = {**os.environ, **data.task_env(), "DECOUPLE_GCLOUD": "TRUE", "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "TF_CPP_MIN_LOG_LEVEL": "2"}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, cwd=data.REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"MaxText did not finish in {timeout:.0f} s; its log ends:\n{self.tail()}") from None

    def check(self, timeout: float) -> None:
        code = self.wait(timeout)
        assert code == 0, f"MaxText exited with {code}; its log ends:\n{self.tail()}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def tail(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-40:])


def metrics(path: str) -> dict[int, dict[str, float]]:
    """Step -> MaxText's train metrics (its ``metrics_file``: full precision)."""
    out = {}
    with open(path) as f:
        for line in f:
            entry = json.loads(line)
            if "learning/loss" in entry:
                out[int(entry["step"])] = entry
    return out


def train_hashes(folder: str) -> dict[int, str | None]:
    return {step: h for (kind, _, step), h in read_batch_hashes(os.path.join(folder, "batches")).items()
            if kind == "train"}


def wait_for(predicate, what: str, launch: Launch, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert launch.process.poll() is None, f"MaxText ended before {what}; its log ends:\n{launch.tail()}"
        assert time.monotonic() < deadline, f"No {what} within {timeout:.0f} s; the log ends:\n{launch.tail()}"
        time.sleep(0.5)


@pytest.mark.timeout(1200)  # four MaxText starts (imports and compilation: most of it); about 4 minutes on 2 cores
def test_maxtext_trains_the_plans_batches_and_resumes_them_exactly_on_another_number_of_processes(
        maxtext, cache_root, jax_cache, tmp_path):
    plan = data.plan_batches(cache_root, data.TRAIN_RUN, range(STEPS))
    common = [f"per_device_batch_size={data.BATCH // 4}", f"jax_cache_dir={jax_cache}"]

    # Uninterrupted: one process with 4 devices.
    whole = str(tmp_path / "whole")
    Launch(maxtext, cache_root, whole, [*common, "run_name=whole", f"base_output_directory={whole}",
                                        "enable_checkpointing=false"], devices=4).check(timeout=600)
    assert train_hashes(whole) == {step: plan[step][0] for step in range(STEPS)}
    trained = metrics(os.path.join(whole, "metrics_0.jsonl"))
    assert sorted(trained) == list(range(STEPS))  # MaxText's step is the plan's step, skipped ones included
    assert {s: int(m["learning/total_weights"]) for s, m in trained.items()} == {s: plan[s][1] for s in range(STEPS)}
    assert [plan[s][1] for s in data.SKIPPED] == [0, 0] and all(plan[s][1] > 0 for s in range(STEPS) if s < 14)

    # Interrupted: the same run on one process, evaluating after steps 0 and 10, killed after checkpoint 8 ...
    output = str(tmp_path / "output")
    first = str(tmp_path / "first")
    checkpointing = [*common, "run_name=resumed", f"base_output_directory={output}", "enable_checkpointing=true",
                     f"checkpoint_period={CHECKPOINT_PERIOD}"]
    launch = Launch(maxtext, cache_root, first, [*checkpointing, "eval_interval=10"], devices=4,
                    launcher=["--eval-run", data.EVAL_RUN])
    checkpoint = os.path.join(output, "resumed", "checkpoints", str(CHECKPOINT_PERIOD))
    wait_for(lambda: os.path.exists(os.path.join(checkpoint, "commit_success.txt")) and 11 in train_hashes(first),
             f"committed checkpoint {CHECKPOINT_PERIOD} and step 11", launch, timeout=600)
    launch.kill()
    before = train_hashes(first)
    assert all(before[step] == plan[step][0] for step in before)

    # ... and restarted on two processes of 2 devices each: it goes on at step 9.
    second = str(tmp_path / "second")
    port = free_port()
    launches = [Launch(maxtext, cache_root, second, checkpointing, devices=2, process=i, processes=2, port=port)
                for i in range(2)]
    try:
        for launch in launches:
            launch.check(timeout=600)
    finally:
        for launch in launches:
            launch.kill()
    after = train_hashes(second)
    assert sorted(after) == list(range(CHECKPOINT_PERIOD + 1, STEPS))
    assert after == {step: plan[step][0] for step in after}
    resumed = [metrics(os.path.join(second, f"metrics_{i}.jsonl")) for i in range(2)]
    assert ({s: m["learning/loss"] for s, m in resumed[0].items()} == {s: m["learning/loss"] for s, m in resumed[1].items()})
    assert sorted(resumed[0]) == list(range(CHECKPOINT_PERIOD + 1, STEPS))
    for step, m in resumed[0].items():
        assert int(m["learning/total_weights"]) == plan[step][1]
        # 2 processes sum gradients across processes (gloo) in another order than 1 process does across its 4
        # devices: float32 rounding, nothing more.
        assert math.isclose(m["learning/loss"], trained[step]["learning/loss"], rel_tol=1e-5), step
    differences = [abs(m["learning/loss"] - trained[s]["learning/loss"]) for s, m in resumed[0].items()]
    print(f"resumed on 2 processes: losses within {max(differences):.2e} of the uninterrupted run's")
    assert sorted(os.listdir(os.path.join(output, "resumed", "checkpoints", "taskdata"))) == [
        "start-000000000.json", f"start-{CHECKPOINT_PERIOD + 1:09d}.json"]

    # The evals: each one pass over the validation run (the rows past its end zero-weight), read again each time.
    records = RunStore(cache_root).get(data.EVAL_RUN).plan.caches[data.TASK].num_records
    eval_plan = data.plan_batches(cache_root, data.EVAL_RUN, range(math.ceil(records / data.BATCH)),
                                  pass_records=records)
    evals = {key: h for key, h in read_batch_hashes(os.path.join(first, "batches")).items() if key[0] == "eval"}
    assert sorted({key[1] for key in evals}) == [0, 1]
    for eval_pass in (0, 1):
        assert {step: h for (_, p, step), h in evals.items() if p == eval_pass} == {
            step: h for step, (h, _) in eval_plan.items()}
    with open(os.path.join(first, "maxtext_0.log")) as f:
        weights = [float(w) for w in re.findall(r"Completed eval after train step \d+, .*total_weights=([\d.]+)", f.read())]
    assert weights == [sum(w for _, w in eval_plan.values())] * 2


@pytest.mark.timeout(600)
def test_a_pipeline_error_inside_maxtexts_loop_ends_the_launcher_with_that_error(maxtext, cache_root, jax_cache,
                                                                                  tmp_path):
    # MaxText's data loader turns the error into a graceful stop (exit 0); the launcher ends with it instead.
    folder = str(tmp_path / "uneven")
    launch = Launch(maxtext, cache_root, folder, [f"per_device_batch_size={data.BATCH // 4}", f"jax_cache_dir={jax_cache}",
                                                  "run_name=uneven", f"base_output_directory={folder}",
                                                  "enable_checkpointing=false"], devices=4,
                    launcher=["--run", data.UNEVEN_RUN])
    assert launch.wait(timeout=600) == 2, launch.tail()
    with open(launch.log_path, errors="replace") as f:
        errors = [line.strip() for line in f if line.startswith("python -m trainer_client.maxtext.train: error:")]
    assert errors == [
        "python -m trainer_client.maxtext.train: error: Step 2 of the plan has a global batch of 5 rows, which "
        "MaxText's 4 trained devices of 2 rows each cannot hold evenly. Plan batch sizes (and every step of a ramp: "
        "--ramp-to with multiple-of=4) that are multiples of 4 and at most 8 (global_batch_size_to_train_on)."
    ], launch.tail()
    assert sorted(train_hashes(folder)) == [0, 1]  # MaxText trained steps 0 and 1, then stopped at step 2
