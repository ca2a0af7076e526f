"""The fast tier's rule (tests/conftest.py): a test not marked slow may not start a process, bind a socket
or run a Beam pipeline; one marked slow may."""

from __future__ import annotations

import contextlib
import pickle
import socket
import subprocess
import sys

import pytest

# A pickle of the class apache_beam.pipeline.Pipeline (protocol 0's GLOBAL): what a Beam pipeline run
# unpickles. The rule refuses it before Beam is even imported.
BEAM_CLASS = b"capache_beam.pipeline\nPipeline\n."
NOT_MARKED = "but is not marked slow: mark it @pytest.mark.slow"


def test_a_test_not_marked_slow_cannot_start_a_process(take_slow_only_record):
    with pytest.raises(RuntimeError, match=rf"started a subprocess \(subprocess.Popen\) {NOT_MARKED}"):
        subprocess.run([sys.executable, "-c", "pass"], timeout=60)
    assert "test_a_test_not_marked_slow_cannot_start_a_process" in take_slow_only_record()


def test_a_test_not_marked_slow_cannot_bind_a_socket(take_slow_only_record):
    with socket.socket() as sock, pytest.raises(RuntimeError, match=rf"bound a socket \(a server\) .* {NOT_MARKED}"):
        sock.bind(("127.0.0.1", 0))
    assert take_slow_only_record() is not None


def test_a_test_not_marked_slow_cannot_run_a_beam_pipeline(take_slow_only_record):
    with pytest.raises(RuntimeError, match=rf"ran a Beam pipeline \(pickle.find_class\) {NOT_MARKED}"):
        pickle.loads(BEAM_CLASS)
    assert take_slow_only_record() is not None


def test_a_test_that_swallows_the_error_is_recorded_all_the_same(take_slow_only_record):
    # What the test's report then says: failed, with the recorded message (conftest's makereport hook).
    with contextlib.suppress(Exception):  # code under test that catches everything
        subprocess.run([sys.executable, "-c", "pass"], timeout=60)
    assert "is not marked slow" in take_slow_only_record()


def test_other_unpickling_and_everything_else_is_allowed(take_slow_only_record):
    from fractions import Fraction

    assert pickle.loads(pickle.dumps(Fraction(1, 3))) == Fraction(1, 3)
    a, b = socket.socketpair()  # no bind: an event loop's self-pipe
    with a, b:
        a.sendall(b"x")
        assert b.recv(1) == b"x"
    assert take_slow_only_record() is None


@pytest.mark.slow
def test_a_slow_test_may_do_all_of_it(take_slow_only_record):  # the negative control
    assert subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, text=True, timeout=60).stdout == "7\n"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
    assert pickle.loads(BEAM_CLASS).__name__ == "Pipeline"
    assert take_slow_only_record() is None
