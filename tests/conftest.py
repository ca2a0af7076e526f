"""Shared fixtures (a fresh registry per test, a tiny SentencePiece model trained once per session, a small
C4 folder), the rule that keeps the fast tier fast, and one node id per test.

The fast tier, ``pytest -m "not slow"``, is unit and property tests. A test that is not marked ``slow`` and
starts a process, binds a socket (a server) or runs a Beam pipeline fails, naming what it did: mark it
``@pytest.mark.slow`` (or its module, ``pytestmark = pytest.mark.slow``). The rule is checked by a Python
audit hook (PEP 578) while such a test and its fixtures are set up and run; Beam is recognised by what a
pipeline run does, unpickling its transforms (taskdata itself never unpickles).
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from collections.abc import Callable, Iterator

import pytest

from taskdata.define.registry import Registry
from tests.pydoc_corpus import pydoc_lines

# Tests must never reach for the network or the user's real cache folder.
os.environ.setdefault("TASKDATA_HOME", os.path.join(os.environ.get("TMPDIR", "/tmp"), "taskdata-test-home"))


# Audit events that only a slow test may cause, and what they mean.
SLOW_EVENTS = {
    "subprocess.Popen": "started a subprocess",
    "os.system": "started a subprocess",
    "os.posix_spawn": "started a subprocess",
    "os.fork": "forked the test process",
    "os.forkpty": "forked the test process",
    "socket.bind": "bound a socket (a server)",
}


class SlowTestError(RuntimeError):
    """A test not marked slow did what only slow tests may do."""


_unmarked: list[pytest.Item] = []  # the test being set up or run, while it is not marked slow
_violations: dict[str, str] = {}  # nodeid -> what it did


def _slow_only(event: str, args: tuple) -> None:
    if not _unmarked:
        return
    if event in SLOW_EVENTS:
        did = SLOW_EVENTS[event]
    elif event == "pickle.find_class" and str(args[0]).startswith("apache_beam."):
        did = "ran a Beam pipeline"
    else:
        return
    item = _unmarked[0]
    message = (f"{item.nodeid} {did} ({event}) but is not marked slow: mark it @pytest.mark.slow, or its module "
               "pytestmark = pytest.mark.slow, so that the fast tier (pytest -m 'not slow') leaves it out")
    _violations.setdefault(item.nodeid, message)
    raise SlowTestError(message)


sys.addaudithook(_slow_only)


@contextlib.contextmanager
def _watched(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("slow") is None:
        _unmarked.append(item)
    try:
        yield
    finally:
        _unmarked.clear()


# Setup (fixtures: a module's shared cache is built in its first test's setup) and the test itself; not
# teardown, where a slow module's fixtures may stop their servers after an unmarked test.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _watched(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _watched(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    # The code under test may have caught SlowTestError; the test fails all the same.
    report = yield
    message = _violations.get(item.nodeid)
    if message and call.when in ("setup", "call") and report.passed:
        report.outcome = "failed"
        report.longrepr = message
    return report


@pytest.fixture
def take_slow_only_record(request: pytest.FixtureRequest) -> Callable[[], str | None]:
    """For the rule's own tests: takes back (and returns) what it recorded against the running test."""
    return lambda: _violations.pop(request.node.nodeid, None)


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture(scope="session")
def tiny_sp_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 300-piece SentencePiece model with T5's special ids, trained on Python's bundled docs."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(pydoc_lines(200_000)), model_writer=model, vocab_size=300,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, model_type="unigram", num_threads=1,
        minloglevel=2,
    )
    path = tmp_path_factory.mktemp("vocab") / "tiny.model"
    path.write_bytes(model.getvalue())
    return str(path)


@pytest.fixture(scope="module")
def c4_folder(tmp_path_factory):
    """A small C4 folder (60 train and 4 validation documents of Python's docs), gzipped JSON lines."""
    import gzip
    import json

    folder = tmp_path_factory.mktemp("c4_sentences")
    lines = pydoc_lines(40_000)
    docs = [" ".join(lines[i : i + 12]) for i in range(0, len(lines), 12)]
    for split, chosen in (("train", docs[:60]), ("validation", docs[60:64])):
        with gzip.open(folder / f"c4-{split}.00000-of-00001.json.gz", "wt") as out:
            for doc in chosen:
                out.write(json.dumps({"text": doc, "timestamp": "2019-04-25T00:00:00Z", "url": "https://x.org"}) + "\n")
    return folder


# pytest-xdist hands out tests by node id and runs one test per id: a second test with the same id (a plugin's
# own parametrization can make them, as schemathesis's did) would never run, and nothing would say so. Checked
# last, on the items every other plugin has settled.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shared = sorted(nodeid for nodeid, n in collections.Counter(item.nodeid for item in items).items() if n > 1)
    if shared:
        raise pytest.UsageError(
            f"{len(shared)} node id(s) name more than one test, and pytest-xdist runs one test per node id, so the "
            f"others would not run: {', '.join(shared[:5])}{' ...' if len(shared) > 5 else ''}. Give each test its own "
            "id (e.g. pytest.mark.parametrize's ids=, or pytest.param(..., id=...))."
        )


# Once the report is written, nothing may keep the suite's process alive (a thread not marked daemon, a child
# process that never exits): CI would wait for it until its own time limit, saying nothing. faulthandler's
# watchdog (a native thread, alive through the interpreter's shutdown) gives the process
# TASKDATA_TEST_EXIT_GRACE_SECONDS (300) to exit, then prints every thread's stack and ends it with exit code 1.
def pytest_unconfigure(config: pytest.Config) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("TASKDATA_TEST_EXIT_GRACE_SECONDS", "300")), exit=True)
