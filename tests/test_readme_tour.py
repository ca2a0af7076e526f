"""The README's tour runs as written, so that it cannot drift from the code.

The test takes the README itself: the cache command of the first set-up command (the install is this
test environment), then every ``bash`` block of "A short tour" in order, in one shell, with
``my_project/tasks.py`` written from the tour's Python block. The only values changed are the ones the
README says may be: ``STEPS=20`` (training length) and ``PORT`` (a free port), plus a fresh
``TASKDATA_HOME``. ``.venv/bin/activate`` is stood in for by one that puts this interpreter and a
``taskdata`` console script of this checkout on ``PATH``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.client_helpers import free_port

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def tour_section() -> str:
    start = README.index("## A short tour")
    return README[start : README.index("\n### When something goes wrong", start)]


def setup_cache_command() -> str:
    """The first set-up command's last step: the build of the cache, with ``.venv/bin/taskdata``."""
    [first_line, *_] = FENCE.search(README).group(2).splitlines()
    command = first_line.split("&&")[-1].strip()
    assert command.startswith(".venv/bin/taskdata cache "), command
    return command


def tour_blocks() -> tuple[list[str], str]:
    blocks = FENCE.findall(tour_section())
    bash = [body for language, body in blocks if language == "bash"]
    [module] = [body for language, body in blocks if language == "python" and body.startswith("# my_project/tasks.py")]
    return bash, module


def fake_venv(work: Path) -> None:
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "taskdata"  # like pip's console script: sys.path[0] is this folder, not the current one
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom taskdata.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    python = bin_dir / "python"  # a script, not a link: a link outside its venv would not find the venv's packages
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')


@pytest.mark.timeout(900)  # longer than the default: minutes on a loaded machine
@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tmp_path):
    bash, module = tour_blocks()
    assert len(bash) >= 5 and any("trainer_client.example.train" in block for block in bash)
    work = tmp_path / "work"
    work.mkdir()
    fake_venv(work)
    # The background server must not outlive the tour (it would also hold the output pipes open).
    script = "\n".join(["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT",
                         setup_cache_command(), *bash[:1]])
    # my_project/ is made by the first block; the module is saved into it as the README says.
    script += f"\ncat > my_project/tasks.py <<'EOF_MODULE'\n{module}EOF_MODULE\n"
    script += "\n".join(["set +o pipefail  # '| head' ends the commands it reads early, as in a terminal", *bash[1:]])
    (work / "tour.sh").write_text(script)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TASKDATA_HOME": str(tmp_path / "home"),
        "STEPS": "20",
        "PORT": str(free_port()),
        "HOME": str(tmp_path),
    }
    result = subprocess.run(["bash", "tour.sh"], cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    log = result.stdout + result.stderr
    (tmp_path / "tour.log").write_text(log)
    assert result.returncode == 0, log[-6000:]

    caches = tmp_path / "home" / "caches"
    assert (work / "my.model").is_file()
    assert {"c4_span_corruption", "my_prefix_lm", "_runs"} <= {p.name for p in caches.iterdir()}
    assert f"OK {caches}/my_prefix_lm/" in result.stdout
    assert '"positions"' in result.stdout  # the /shards answer curl printed
    assert "step 20/20  loss " in result.stderr
    assert "wrote 32 predictions of split 'validation' to preds.jsonl" in result.stderr
    lines = [json.loads(line) for line in (work / "preds.jsonl").read_text().splitlines()]
    assert len(lines) == 32 and all(line["id"].startswith("c4_span_corruption/validation/") for line in lines)
    table = result.stdout[result.stdout.index("task                "):]
    assert textwrap.dedent(table).split()[:6] == [
        "task", "examples", "scored", "span_accuracy", "span_exact_match", "token_accuracy"
    ]
    assert "Traceback" not in log
