"""The type checker's verdict is part of the suite: mypy over ``taskdata``, ``server`` and ``trainer_client``.

The configuration is ``[tool.mypy]`` in pyproject.toml (which packages, ``check_untyped_defs``, the
third-party packages without type information). mypy keeps its cache in ``.mypy_cache`` at the root
(gitignored), so a run after a small change re-checks only what the change touches.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["taskdata", "server", "trainer_client"]


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    # The configuration is read from pyproject.toml in the working folder.
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )


def _config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["mypy"]


@pytest.mark.slow
def test_the_packages_type_check_with_no_errors() -> None:
    result = _mypy()
    assert result.returncode == 0, (
        f"mypy found errors (fix the code or its annotations; run '.venv/bin/python -m mypy' to see them):\n"
        f"{result.stdout}{result.stderr}"
    )
    assert "Success: no issues found" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow
def test_the_checker_reports_errors_in_unannotated_functions(tmp_path: Path) -> None:
    # The negative control: with the project's settings, a type error inside a function without
    # annotations is found (check_untyped_defs), and so is a 'type: ignore' that names no code.
    bad = tmp_path / "unannotated_example.py"
    bad.write_text('def join(parts):\n    return 1 + "a"\n\n\nx: int = "a"  # type: ignore\n')
    result = _mypy("--config-file", str(ROOT / "pyproject.toml"), str(bad))
    assert result.returncode == 1, result.stdout + result.stderr
    assert '[operator]' in result.stdout, result.stdout
    assert "[ignore-without-code]" in result.stdout, result.stdout


def test_the_configuration_covers_the_packages_and_hides_nothing() -> None:
    config = _config()
    assert config["files"] == PACKAGES
    assert config["check_untyped_defs"] is True
    assert config["warn_unused_ignores"] is True
    assert "ignore-without-code" in config["enable_error_code"]
    # Missing type information is accepted only for named third-party packages, never for ours, and
    # no module's errors are switched off.
    assert "ignore_missing_imports" not in config
    assert "ignore_errors" not in config
    for override in config.get("overrides", []):
        assert "ignore_errors" not in override, override
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        for module in modules:
            assert module.split(".")[0] not in PACKAGES, f"{module}: our own packages are always checked"
