"""Iterators left open are closed at exit, before the interpreter's teardown.

Their reading threads are daemons. One still running into the teardown can abort the process after its
last line (``terminate called without an active exception``, SIGABRT: a daemon thread woken inside numpy's
C++ code is ended by pthread_exit). That abort is rare (1 run in 20 of README's Grain snippet), so the
tests check its cause, which is deterministic: an exit hook registered before ``trainer_client`` is
imported runs after the client's own (atexit runs hooks last in, first out) and lists the reading threads
still alive at that point. Without the client's hook they are all still reading ahead.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from tests.client_helpers import LENGTHS, client_env, shared_root

pytestmark = pytest.mark.slow  # cache jobs (Beam)

SCRIPT = """
import atexit, threading

def report():  # runs after trainer_client's exit hook
    alive = sorted(t.name for t in threading.enumerate() if t.name.startswith("taskdata-"))
    print("alive at exit:", alive, flush=True)

atexit.register(report)

from taskdata.runs import RunStore
from trainer_client import DataIterator, HostSlice, LocalAssignments

root, lengths = {root!r}, {lengths!r}
def source():
    return LocalAssignments.from_cache_root(RunStore(root).get("mix4"), root)

{body}
print("left open", flush=True)
"""

CASES = {
    "iterator": "data = DataIterator(source(), lengths, host_slice=HostSlice(0, 1), workers={workers})\nnext(data)",
    "grain": (
        "from trainer_client.grain_dataset import RunIterDataset\n"
        "it = iter(RunIterDataset(source(), lengths, host_slice=HostSlice(0, 1)))\nnext(it)"
    ),
    "closed": (
        "with DataIterator(source(), lengths, host_slice=HostSlice(0, 1), workers={workers}) as data:\n"
        "    next(data)"
    ),
}


def run_script(root: str, body: str) -> subprocess.CompletedProcess[str]:
    script = SCRIPT.format(root=root, lengths=LENGTHS, body=body)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=client_env(1),
                          capture_output=True, text=True, timeout=240)  # fmt: skip


@pytest.mark.parametrize(("case", "workers"), [("iterator", 0), ("iterator", 2), ("grain", 0), ("closed", 0), ("closed", 2)])
def test_no_reading_thread_outlives_the_exit_hooks(tmp_path_factory, case, workers):
    result = run_script(shared_root(tmp_path_factory), CASES[case].format(workers=workers))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "left open" in result.stdout and "alive at exit: []" in result.stdout, result.stdout + result.stderr[-2000:]


def test_the_check_sees_threads_that_nothing_closes(tmp_path_factory):
    """Negative control: with the client's exit hook taken away, the reading threads are still alive."""
    body = (
        "import trainer_client.iterator as module\natexit.unregister(module._close_open_iterators)\n"
        + CASES["iterator"].format(workers=0)
    )
    result = run_script(shared_root(tmp_path_factory), body)
    # Threads left reading into the teardown may abort the process after its last line (the module docstring):
    # here, with nothing closing them, that abort is allowed; the list printed before it is what is checked.
    assert result.returncode in (0, -signal.SIGABRT), result.stderr[-3000:]
    assert "'taskdata-read'" in result.stdout, result.stdout
