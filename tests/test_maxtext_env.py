"""taskdata on Python 3.12 with MaxText's jax: the MaxText environment (deploy/maxtext_env.sh) installs taskdata,
its jax is the newest the ``client`` extra admits, and the client's tests pass there (jax 0.12, orbax, grain as
MaxText pins them), not only on the reference 3.11.

The ``client`` extra bounds jax below the next minor release because ``trainer_client.peers`` takes
``jax.distributed``'s client from ``jax._src``; the peer watchdog's job tests run here, on that jax, and so do the
client's read path and its JAX, orbax (two processes) and Grain seams, every tier.

Skipped where the MaxText environment is not built; a failure in CI (``CI=true``), whose ``.ci/run`` builds it.
"""

from __future__ import annotations

import os
import subprocess
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests import maxtext_helpers as data

pytestmark = pytest.mark.slow

# The client's read path, its JAX/orbax/Grain seams, the peer watchdog (jax._src) and MaxText's numpy fields.
CLIENT_TESTS = ["tests/test_client_iterator.py", "tests/test_client_reading.py", "tests/test_client_grain.py",
                "tests/test_client_orbax_state.py", "tests/test_client_arrays.py", "tests/test_client_peers.py",
                "tests/test_maxtext_fields.py", "tests/test_maxtext_layout.py"]


@pytest.fixture(scope="module")
def python() -> str:
    python = data.maxtext_python()
    if python is None:
        if os.environ.get("CI") == "true":
            pytest.fail("The MaxText environment is missing: .ci/run builds it with 'bash deploy/maxtext_env.sh'.")
        pytest.skip("The MaxText environment is not built here: run 'bash deploy/maxtext_env.sh' to run this test.")
    return python


def client_requirement(name: str) -> Requirement:
    with open(os.path.join(data.REPO, "pyproject.toml"), "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["client"]
    (requirement,) = (Requirement(r) for r in extra if Requirement(r).name == name)
    return requirement


def test_the_environment_is_python_3_12_with_the_newest_jax_the_client_extra_admits(python):
    out = subprocess.run([python, "-c", "import sys, jax, jaxlib; print(*sys.version_info[:2], jax.__version__, "
                                        "jaxlib.__version__)"],
                         capture_output=True, text=True, check=True, timeout=120).stdout.split()
    assert out[:2] == ["3", "12"], out
    for name, installed in zip(("jax", "jaxlib"), map(Version, out[2:]), strict=True):
        specifier = client_requirement(name).specifier
        assert specifier.contains(installed), f"{name} {installed} is outside the client extra's {specifier}"
        # The bound stops right above the minor tested here: a newer MaxText jax moves it (and this check).
        newer = Version(f"{installed.major}.{installed.minor + 1}.0")
        assert not specifier.contains(newer), f"{name} {specifier} admits {newer}, which no environment tests"


@pytest.mark.timeout(900)
def test_the_clients_tests_pass_on_python_3_12_with_maxtexts_jax(python):
    result = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CLIENT_TESTS],
                            cwd=data.REPO, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "PYTHONPATH": data.REPO})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "deselected" not in summary, summary
