"""The suite's process ends after its report even when something would keep it alive (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LEFT_RUNNING = """
import threading

def test_leaves_a_thread_that_never_ends():
    threading.Thread(target=threading.Event().wait, name="never-ends").start()
"""

ENDS = """
def test_leaves_nothing():
    assert True
"""


def _pytest(folder: str, module: str) -> subprocess.CompletedProcess[str]:
    path = os.path.join(folder, "test_generated.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(module))
    env = dict(os.environ, TASKDATA_TEST_EXIT_GRACE_SECONDS="3", PYTHONPATH=REPO)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:randomly", "-p", "no:cacheprovider",
         "--rootdir", folder, path],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )


def test_a_thread_left_running_ends_the_process_with_every_stack_and_code_1(tmp_path):
    done = _pytest(str(tmp_path), LEFT_RUNNING)
    assert "1 passed" in done.stdout
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "Timeout (0:00:03)!" in done.stderr and "in wait" in done.stderr, done.stderr[-3000:]


def test_a_suite_that_leaves_nothing_running_exits_with_pytests_code(tmp_path):
    done = _pytest(str(tmp_path), ENDS)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "Timeout" not in done.stderr


# A plugin that collects two tests from one file, named "same" and {second}: with "same" twice, one node id, as
# schemathesis's own parametrization made.
SHARED_ID = """
import pytest

class Same(pytest.Item):
    def runtest(self):
        pass

class Twice(pytest.File):
    def collect(self):
        yield Same.from_parent(self, name="same")
        yield Same.from_parent(self, name="{second}")

def pytest_collect_file(file_path, parent):
    if file_path.name == "test_generated.py":
        return Twice.from_parent(parent, path=file_path)
"""


def test_two_tests_with_one_node_id_stop_the_suite_naming_the_id(tmp_path):
    (tmp_path / "conftest.py").write_text(SHARED_ID.format(second="same"))
    done = _pytest(str(tmp_path), ENDS)
    assert done.returncode == 4, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "test_generated.py::same" in done.stderr and "runs one test per node id" in done.stderr, done.stderr


def test_tests_with_their_own_node_ids_run(tmp_path):
    (tmp_path / "conftest.py").write_text(SHARED_ID.format(second="other"))
    done = _pytest(str(tmp_path), ENDS)
    assert done.returncode == 0 and "3 passed" in done.stdout, (done.stdout[-2000:], done.stderr[-2000:])
