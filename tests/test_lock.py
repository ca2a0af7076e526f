"""requirements.lock is what CI installed: CI installs with ``-c requirements.lock`` (.ci/run), so the
versions the tests run are the ones that ship. Elsewhere the environment is the developer's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deploy.lock import LOCK, differences, lock_text


def test_the_installed_packages_are_the_locked_versions():
    changed = differences(Path(LOCK).read_text(), lock_text())
    if changed and os.environ.get("CI") != "true":
        pytest.skip("this environment was not installed with -c requirements.lock (what CI checks): "
                    + "; ".join(changed[:6]))
    assert changed == [], (
        "the installed packages (+) are not requirements.lock's (-): after changing a dependency, install it and "
        f"run 'python deploy/lock.py' in the environment the suite passes in: {changed}")


def test_a_lock_that_differs_from_the_environment_is_told_line_by_line():  # the negative control
    text = lock_text()
    moved = text.replace("\nnumpy==", "\nnumpy==0.0.0.dev0+", 1)
    assert differences(moved, text) == [f"-{line}" for line in moved.splitlines() if line.startswith("numpy==")] + [
        f"+{line}" for line in text.splitlines() if line.startswith("numpy==")]
    assert differences(text, text) == []
