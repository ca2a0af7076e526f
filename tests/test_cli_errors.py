"""Every command ends a user's error with one line and an exit code of its own (``taskdata.exits``).

The commands run as a user runs them, in their own process, so that what reaches the terminal (Beam's
logs, tracebacks, a closed pipe, Ctrl-C) is what is checked; each first line is pinned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from taskdata.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_DATA,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    run_command,
)
from tests.client_helpers import free_port

pytestmark = pytest.mark.slow  # subprocesses, servers

REPO = Path(__file__).resolve().parents[1]
MODULE = "tests.cache_tasks"


def environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def taskdata(*argv: str, cwd: Path | str = REPO, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "taskdata", *argv], cwd=cwd, env=environment(**env),
                          capture_output=True, text=True, timeout=timeout)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("[cache]")]


def test_run_command_gives_each_outcome_its_code(capsys):
    def raising(error):
        def body():
            raise error

        return body

    kinds = {"usage_errors": (ValueError,), "data_errors": (RuntimeError,)}
    assert run_command("prog", raising(ValueError("bad value")), **kinds) == EXIT_USAGE
    assert run_command("prog", raising(RuntimeError("job failed")), **kinds) == EXIT_DATA
    assert run_command("prog", raising(KeyboardInterrupt()), **kinds) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.splitlines() == [
        "prog: error: bad value", "prog: error: job failed", "prog: interrupted"
    ]
    assert run_command("prog", raising(ZeroDivisionError("a bug")), **kinds) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1] == (
        "prog: internal error (a bug; the traceback above says where). Please report it."
    )
    assert run_command("prog", raising(ValueError("shown")), **kinds, debug=True) == EXIT_USAGE
    assert "Traceback" in capsys.readouterr().err  # --debug shows where a user error came from


def test_an_output_inside_a_regular_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    result = taskdata("cache", "--task", "toy_det", "--module", MODULE, "--output", str(tmp_path / "file" / "cache"))
    assert result.returncode == EXIT_USAGE
    assert error_lines(result.stderr) == [
        f"taskdata cache: error: --output {tmp_path / 'file' / 'cache'} cannot be a cache root: {tmp_path / 'file'} is "
        "a file, not a folder. Choose a folder (it is created if missing)."
    ]


def test_a_malformed_source_line_is_one_line_without_beams_logged_traceback(tmp_path):
    corpus = tmp_path / "c4"
    corpus.mkdir()
    path = corpus / "c4-train.00000-of-00001.json"
    path.write_text('{"text": "fine", "timestamp": "2019-04-01T00:00:00Z", "url": "u"}\nnot json\n')
    result = taskdata("cache", "--task", "toy_c4", "--module", MODULE, "--output", str(tmp_path / "cache"),
                      TASKDATA_TEST_C4_DIR=str(corpus))
    assert result.returncode == EXIT_DATA
    lines = error_lines(result.stderr)
    assert lines[0] == (
        "taskdata cache: error: Cache build of task 'toy_c4' failed in the Beam pipeline: Task 'toy_c4', split "
        f"'train', source shard 0 ('{path}'): reading the source failed at record 1 of the shard: SourceError: "
        f"{path}, line 2: not valid JSON (Expecting value at column 1)"
    )
    assert lines[1].startswith("The partial version ") and len(lines) == 2, result.stderr
    assert "Traceback" not in result.stderr and "apache_beam" not in result.stderr
    shown = taskdata("cache", "--task", "toy_c4", "--module", MODULE, "--output", str(tmp_path / "cache"), "--debug",
                     TASKDATA_TEST_C4_DIR=str(corpus))
    assert shown.returncode == EXIT_DATA and "Traceback" in shown.stderr  # --debug shows Beam's log


def test_a_closed_pipe_ends_quietly_with_141():
    process = subprocess.Popen([sys.executable, "-m", "taskdata", "inspect", "toy_det", "--module", MODULE, "-n", "200"],
                               cwd=REPO, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout.readline().startswith(b"--- example toy_det/train/")
        process.stdout.close()  # what `| head -1` does
        assert process.wait(timeout=120) == EXIT_BROKEN_PIPE
        assert process.stderr.read() == b""
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.stderr.close()


SLOW_TASKS = '''
import time

import taskdata
from taskdata.define.features import Feature
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.preprocessors import Tokenize


def slow_documents(split, shard):
    for i in range(600):
        time.sleep(0.1)
        yield {"text": f"document {i}"}


FEATURES = {"targets": Feature(ByteVocabulary())}
taskdata.add_task("slow_task", taskdata.FunctionSource(slow_documents, {"train": ["0"]}),
                  [Tokenize()], output_features=FEATURES)


# Sources that swallow a Ctrl-C where it lands (a retry loop that catches everything, say): the first one
# only, or every one (then the source runs to its end and the task is valid: the job would finish).
def _swallowing(swallow, count, key):
    swallowed = 0
    for i in range(count):
        try:
            time.sleep(0.1)
        except KeyboardInterrupt:
            swallowed += 1
            if swallowed > swallow:
                raise
        yield {key: f"document {i}"}


def swallows_one(split, shard):
    yield from _swallowing(1, 600, "text")


def swallows_all(split, shard):
    yield from _swallowing(10**6, 80, "targets")


for source in (swallows_one, swallows_all):
    taskdata.add_task(source.__name__, taskdata.FunctionSource(source, {"train": ["0"]}), [Tokenize()],
                      output_features=FEATURES)
'''


def _ctrl_c_as_at_a_terminal() -> None:
    # A shell without job control starts a background command ('pytest ... &') with SIGINT ignored, children
    # inherit that, and Python then leaves Ctrl-C ignored (as it should, for nohup and '&'): the job under
    # test gets the default disposition, as from a terminal, whatever started pytest.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("task", ["slow_task", "swallows_one", "swallows_all"])
def test_ctrl_c_on_cache_exits_130_without_a_traceback(tmp_path, task):
    # swallows_one: the Ctrl-C is raised again (taskdata.beam.job._StickyInterrupts) and stops the job;
    # swallows_all: the source runs to its end, and the job, which would now finish, is still interrupted and
    # its version never marked complete.
    (tmp_path / "slow_tasks.py").write_text(textwrap.dedent(SLOW_TASKS))
    process = subprocess.Popen(
        [sys.executable, "-m", "taskdata", "cache", "--task", task, "--module", "slow_tasks",
         "--output", str(tmp_path / "cache")],
        cwd=tmp_path, env=environment(PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_as_at_a_terminal,
    )  # fmt: skip
    try:
        for line in process.stderr:
            if line.startswith("[cache] writing "):
                break
        time.sleep(3)  # inside the pipeline
        process.send_signal(signal.SIGINT)
        rest = process.stderr.read()
        assert process.wait(timeout=120) == EXIT_INTERRUPTED, rest
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
    assert "Traceback" not in rest
    assert rest.splitlines()[-1] == "taskdata cache: interrupted"
    assert "is not marked complete and will never be read" in rest
    assert not list((tmp_path / "cache").rglob("COMPLETED"))


def test_serve_token_file_problems_are_our_words_not_pydantics(tmp_path):
    result = taskdata("serve", "--cache-root", str(tmp_path), "--token-file", str(tmp_path / "missing"))
    assert result.returncode == EXIT_USAGE
    assert result.stderr.splitlines() == [
        f"taskdata serve: error: Cannot read the token file {tmp_path / 'missing'}: No such file or directory."
    ]
    (tmp_path / "empty").write_text("\n")
    result = taskdata("serve", "--cache-root", str(tmp_path), "--token-file", str(tmp_path / "empty"))
    assert result.stderr.splitlines() == [
        f"taskdata serve: error: The token file {tmp_path / 'empty'} is empty; put the bearer token in it."
    ]


def test_serve_without_a_token_outside_loopback_needs_insecure(tmp_path):
    result = taskdata("serve", "--cache-root", str(tmp_path), "--host", "0.0.0.0", "--port", "1")
    assert result.returncode == EXIT_USAGE
    assert result.stderr.splitlines() == [
        "taskdata serve: error: Refusing to serve 0.0.0.0:1 without a bearer token: anyone who can connect could read "
        "every run and create runs. Give --token-file FILE (or $TASKDATA_SERVER_TOKEN), or pass --insecure on a "
        "trusted network."
    ]


def test_serve_without_a_token_warns_and_says_what_it_serves(tmp_path):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "taskdata", "serve", "--cache-root", str(tmp_path), "--port", str(port)],
        cwd=REPO, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines = [process.stderr.readline().rstrip("\n") for _ in range(2)]
    finally:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
        process.stderr.close()
    assert lines == [
        f"taskdata serve: WARNING: no bearer token: every route on 127.0.0.1:{port} is open to anyone who can "
        "connect. Give --token-file FILE (or $TASKDATA_SERVER_TOKEN) to require one.",
        f"taskdata serve: cache root {tmp_path}; 0 run(s): none yet (create one with taskdata plan)",
    ]


def test_module_is_found_in_the_current_folder_like_python_m(tmp_path, monkeypatch, capsys):
    from taskdata.cli import main

    package = tmp_path / "tour_project_cwd"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(textwrap.dedent('''
        import taskdata
        from taskdata.define.features import Feature
        from taskdata.define.vocabularies import ByteVocabulary
        from taskdata.preprocessors import Tokenize

        def lines(split, shard):
            yield {"text": "one line"}

        taskdata.add_task("cwd_task", taskdata.FunctionSource(lines, {"train": ["0"]}), [Tokenize()],
                          output_features={"targets": Feature(ByteVocabulary())})
    '''))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert main(["list", "--module", "tour_project_cwd.tasks"]) == 0
    assert "task     cwd_task  FunctionSource -> Tokenize" in capsys.readouterr().out


def test_version():
    import taskdata

    result = subprocess.run([sys.executable, "-m", "taskdata", "--version"], cwd=REPO, env=environment(),
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, f"taskdata {taskdata.__version__}\n")


def _every_help(parser) -> list[str]:
    import argparse

    texts = [parser.format_help()]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                texts.extend(_every_help(sub))
    return texts


def test_help_texts_speak_of_the_product_only():
    from taskdata.cli import build_parser
    from trainer_client.example.train import build_parser as trainer_parser

    texts = [*_every_help(build_parser()), trainer_parser().format_help()]
    for script in ("deploy/drill.py", "deploy/faults.py"):
        result = subprocess.run([sys.executable, script, "--help"], cwd=REPO, env=environment(), capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        texts.append(result.stdout)
    assert len(texts) > 10  # every command and subcommand, the trainer and the two deploy scripts
    for text in texts:
        assert "issue" not in text.lower(), text


def test_the_package_metadata_carries_the_license_without_the_deprecated_table(tmp_path):
    import shutil
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "license" not in project, "a license table is deprecated by setuptools >= 77; LICENSE is the license"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tmp_path / name)
    for package in ("taskdata", "server", "trainer_client"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "egg_info"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "deprecat" not in (result.stdout + result.stderr).lower()
    metadata = (tmp_path / "taskdata.egg-info" / "PKG-INFO").read_text()
    assert "License-File: LICENSE" in metadata and "Apache License" in (REPO / "LICENSE").read_text()


def test_a_definition_that_cannot_be_fingerprinted_is_a_usage_error_not_a_bug(tmp_path):
    (tmp_path / "local_tasks.py").write_text(textwrap.dedent('''
        import taskdata
        from taskdata.define.features import Feature
        from taskdata.define.vocabularies import ByteVocabulary
        from taskdata.preprocessors import Tokenize

        def make_source():
            def lines(split, shard):  # a local function: no stable name to fingerprint
                yield {"targets": "one line"}
            return lines

        taskdata.add_task("local_task", taskdata.FunctionSource(make_source(), {"train": ["0"]}), [Tokenize()],
                          output_features={"targets": Feature(ByteVocabulary())})
    '''))
    result = taskdata("cache", "--task", "local_task", "--module", "local_tasks", "--output", str(tmp_path / "cache"),
                      cwd=tmp_path, PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}")
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "Traceback" not in result.stderr
    assert error_lines(result.stderr) == [
        "taskdata cache: error: Cannot fingerprint make_source.<locals>.lines from local_tasks: lambdas and local "
        "functions have no stable name. Define it at module level, or use a dataclass whose fields are its parameters."
    ]
