"""Writes requirements.lock: exact versions of everything the image installs, from a tested environment.

The closure of taskdata's runtime dependencies plus the extras the image runs: ``cache`` (Beam), ``server``,
``client`` (JAX), ``tf``, ``seqio`` and ``plot`` (matplotlib), with each package's version as installed in the environment this runs in (the one the test suite passed in), so the image
runs what was tested. Test-only tools (pytest, ruff, emulators) are not in it.

    python deploy/lock.py            # rewrite requirements.lock
    python deploy/lock.py --check    # exit 1 if requirements.lock is not what this environment gives
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCK = os.path.join(ROOT, "requirements.lock")
IMAGE_EXTRAS = ("cache", "server", "client", "tf", "seqio", "plot")


def declared_requirements() -> list[Requirement]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    for extra in IMAGE_EXTRAS:
        requirements += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return requirements


def closure(roots: list[Requirement]) -> dict[str, str]:
    """name -> installed version for every distribution the roots need (markers for this interpreter)."""
    pinned: dict[str, str] = {}
    queue = [(r, frozenset()) for r in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        requirement, extras = queue.pop()
        if requirement.marker is not None and not any(
            requirement.marker.evaluate({"extra": e}) for e in (extras or {""})
        ):
            continue
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            raise SystemExit(
                f"{requirement.name} is required but not installed here; install '.[client,seqio]' first."
            ) from None
        pinned[name] = dist.version
        for child in dist.requires or []:
            queue.append((Requirement(child), frozenset(requirement.extras)))
    return dict(sorted(pinned.items()))


def render(pins: dict[str, str]) -> str:
    header = (
        "# Exact versions the Docker image installs (deploy/lock.py wrote this from the environment the\n"
        f"# tests passed in: Python {sys.version_info.major}.{sys.version_info.minor}, linux x86_64).\n"
    )
    return header + "".join(f"{name}=={version}\n" for name, version in pins.items())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = render(closure(declared_requirements()))
    if args.check:
        with open(LOCK) as f:
            return 0 if f.read() == text else 1
    with open(LOCK, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
