"""README's "Train with PyTorch" snippets run as written on a toy run: the torch, DCP and Megatron ones here, the
torchtitan one in torchtitan's environment (deploy/torchtitan_env.sh)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client_helpers import LENGTHS, REPO, shared_root

SECTION = "## Train with PyTorch"
SETTINGS = re.compile(r"^CACHE_ROOT, RUN, LENGTHS, VOCAB = .*$", re.M)
TORCHTITAN_PYTHON = os.path.join(os.environ.get("TASKDATA_TORCHTITAN_VENV", os.path.join(REPO, ".venv-torchtitan")),
                                 "bin", "python")


def snippets() -> list[str]:
    text = (Path(REPO) / "README.md").read_text()
    start = text.index(SECTION + "\n")
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], re.S)


def test_the_section_shows_dcp_megatron_and_torchtitan():
    blocks = snippets()
    assert len(blocks) == 4 and SETTINGS.search(blocks[0]), "settings, then DCP, Megatron and torchtitan"
    for block, call in zip(blocks[1:], ("dcp.save(", "RunMapDataset(", "TaskdataDataLoader.Config("), strict=True):
        assert call in block


def run(python: str, blocks: list[str], root: str, path: Path) -> None:
    toy = f"CACHE_ROOT, RUN, LENGTHS, VOCAB = {root!r}, 'mix4', {LENGTHS!r}, 384"
    path.write_text("\n\n".join([SETTINGS.sub(lambda _: toy, blocks[0]), *blocks[1:], "print('snippets ran')"]))
    result = subprocess.run([python, str(path)], cwd=str(path.parent), env={**os.environ, "PYTHONPATH": REPO},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "snippets ran" in result.stdout, result.stderr[-3000:]


@pytest.mark.slow
def test_the_torch_and_megatron_snippets_run_against_a_toy_run(tmp_path_factory, tmp_path):
    blocks = snippets()
    run(sys.executable, blocks[:3], shared_root(tmp_path_factory), tmp_path / "torch_snippets.py")


@pytest.mark.slow
def test_the_torchtitan_snippet_runs_in_torchtitans_environment(tmp_path_factory, tmp_path):
    if not os.path.exists(TORCHTITAN_PYTHON):
        message = f"no torchtitan environment ({TORCHTITAN_PYTHON}): build it with 'bash deploy/torchtitan_env.sh'"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    blocks = snippets()
    run(TORCHTITAN_PYTHON, [blocks[0], blocks[3]], shared_root(tmp_path_factory), tmp_path / "torchtitan_snippet.py")
