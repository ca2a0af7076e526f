"""SIGKILL the cache job at random moments: nothing incomplete ever looks complete, reruns are identical."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskdata.cache.verify import verify_version
from tests.cache_helpers import files_of

ROOT = Path(__file__).resolve().parent.parent


def _command(output: Path) -> list[str]:
    return [sys.executable, "-m", "taskdata", "cache", "--task", "toy_random", "--module", "tests.cache_tasks",
            "--output", str(output), "--num-shards", "3", "--quiet", "--force"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.timeout(900)  # longer than the default: minutes on a loaded machine
@pytest.mark.slow
def test_sigkill_at_random_moments_never_leaves_a_complete_looking_partial_cache(tmp_path):
    reference_root = tmp_path / "reference"
    started = time.monotonic()
    subprocess.run(_command(reference_root), check=True, env=_env(), cwd=ROOT, capture_output=True, timeout=300)
    full_run = time.monotonic() - started
    [reference] = [p.parent for p in reference_root.rglob("COMPLETED")]

    output = tmp_path / "crashy"
    rng = random.Random(1234)
    kills = attempts = 0
    while kills < 10 and attempts < 30:
        attempts += 1
        process = subprocess.Popen(_command(output), env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        # Up to the full run time: late kills land in the commit phase, the one that must be atomic.
        time.sleep(rng.uniform(0.05, full_run))
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            kills += 1
        process.wait(timeout=60)
        for marker in output.rglob("COMPLETED"):
            # Whatever a killed job left marked complete must verify in full.
            assert verify_version(str(marker.parent)) == []
    assert kills >= 10, f"only {kills} of {attempts} runs were killed before they finished"

    subprocess.run(_command(output), check=True, env=_env(), cwd=ROOT, capture_output=True, timeout=300)
    current = (output / "toy_random" / "CURRENT").read_text().strip()
    assert files_of(str(output / "toy_random" / current)) == files_of(str(reference))
