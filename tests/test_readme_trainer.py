"""README's "Use it from your trainer" snippets run as written (on a toy run), so they cannot rot."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client_helpers import LENGTHS, REPO, client_env, shared_root

SECTION = "## Use it from your trainer"
SETTINGS = re.compile(r"^CACHE_ROOT, RUN, LENGTHS = .*$", re.M)


def snippets() -> list[str]:
    text = (Path(REPO) / "README.md").read_text()
    start = text.index(SECTION + "\n")
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], re.S)


def test_the_section_shows_orbax_tf_data_and_grain():
    blocks = snippets()
    assert len(blocks) == 4 and SETTINGS.search(blocks[0]), "settings, then orbax, tf.data and Grain"
    for block, call in zip(blocks[1:], ("DataCheckpointSave(", "tf_dataset(", "grain.checkpoint.CheckpointSave("), strict=True):
        assert call in block


@pytest.mark.slow
def test_the_snippets_run_against_a_toy_run(tmp_path_factory, tmp_path):
    root = shared_root(tmp_path_factory)
    blocks = snippets()
    toy = f"CACHE_ROOT, RUN, LENGTHS = {root!r}, 'mix4', {LENGTHS!r}"
    script = "\n\n".join([SETTINGS.sub(lambda _: toy, blocks[0]), *blocks[1:], "print('snippets ran')"])
    (tmp_path / "snippets.py").write_text(script)
    result = subprocess.run(
        [sys.executable, str(tmp_path / "snippets.py")],
        cwd=str(tmp_path), env=client_env(1), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0 and "snippets ran" in result.stdout, result.stderr[-3000:]
