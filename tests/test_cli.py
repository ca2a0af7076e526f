"""The command line: what each command prints, its errors and exit codes, and what it imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taskdata.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TASKDATA_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "taskdata", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


@pytest.mark.slow
def test_list_and_help_import_no_heavy_library_and_build_nothing(tmp_path):
    code = (
        "import sys\n"
        "from taskdata.cli import main\n"
        "main(['list']); main(['list', '--module', 'tests.cache_tasks'])\n"
        "heavy = sorted(m for m in ('tensorflow', 'apache_beam', 'jax', 'sentencepiece', 'pyarrow', 'fastapi', 'seqio') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), TASKDATA_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    assert "task     c4_span_corruption  C4Source -> Rekey -> Tokenize -> SpanCorruption -> AppendEosAfterTrim" in out.stdout
    assert "mixture  c4_span_corruption_prefix_lm  [c4_span_corruption=1 (50%), c4_prefix_lm=1 (50%)]" in out.stdout
    assert "task     toy_det  FunctionSource -> EncodeText" in out.stdout
    assert list(tmp_path.iterdir()) == []  # listing builds no corpus and trains no vocabulary


def test_help_lists_every_command():
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0


def test_show_prints_the_fingerprint(capsys):
    from taskdata.define.registry import Registry

    registry = Registry()
    registry.load_module("tests.cache_tasks")
    assert main(["show", "toy_det", "--module", "tests.cache_tasks"]) == 0
    out = capsys.readouterr().out
    assert f"fingerprint: {registry.get('toy_det').fingerprint()}" in out
    assert "registered:  " in out and "cache_tasks.py" in out
    definition = json.loads(out.split("definition:\n", 1)[1])
    assert definition["preprocessors"][0]["fields"] == {"prefix_chars": 8}


def test_inspect_prints_decoded_examples_with_their_ids(capsys):
    assert main(["inspect", "toy_det", "--module", "tests.cache_tasks", "--split", "validation", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "--- example toy_det/validation/0/0" in out and "--- example toy_det/validation/0/1" in out
    assert "targets (decoded): 'validation 0.0: " in out


@pytest.mark.slow
def test_unknown_name_is_one_clear_line_and_exit_2(tmp_path):
    result = run_cli("show", "c4_span_corruptoin", home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "taskdata show: error: Unknown task or mixture 'c4_span_corruptoin'. Did you mean: c4_span_corruption, "
        "c4_span_corruption_prefix_lm? "
        "Use 'taskdata list' to see registered names, or pass --module to import the module that registers it.")


@pytest.mark.slow
def test_path_like_name_is_rejected(tmp_path):
    result = run_cli("inspect", "..:..:etc", home=tmp_path)
    assert result.returncode == 2 and "Invalid task or mixture name '..:..:etc'" in result.stderr


def test_vocab_train_is_deterministic(tmp_path, capsys):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("\n".join(f"line {i} of some text about alpha beta gamma {i % 7}" for i in range(400)))
    os.environ["TASKDATA_TEST_TEXT_DIR"] = str(texts)
    try:
        for out in ("one.model", "two.model"):
            assert main(["vocab", "train", "--task", "toy_text", "--module", "tests.cache_tasks", "--size", "60",
                         "--out", str(tmp_path / out)]) == 0
    finally:
        del os.environ["TASKDATA_TEST_TEXT_DIR"]
    assert (tmp_path / "one.model").read_bytes() == (tmp_path / "two.model").read_bytes()
    assert capsys.readouterr().out.startswith("wrote ")


def test_entry_point_tasks_are_registered(tmp_path, monkeypatch):
    from taskdata.define.registry import Registry

    (tmp_path / "ep_tasks_mod.py").write_text(
        "from tests.helpers import make_task\n"
        "def register(registry):\n"
        "    registry.add(make_task('from_entry_point'))\n")
    dist = tmp_path / "ep_tasks_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-tasks-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[taskdata.tasks]\nmine = ep_tasks_mod:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry()
    registry.load_entry_points()
    assert "from_entry_point" in registry
