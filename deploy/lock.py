"""Writes requirements.lock: the exact version of every package the project installs, from a tested environment.

One lock holds everything: taskdata's dependencies and those of every extra (the ``test`` extra installs them
all), each at the version installed in the environment this runs in, the one the whole test suite passed in
(Python 3.11, linux x86_64). CI installs with ``pip install -e '.[test]' -c requirements.lock``, so the
tests run the versions that ship. The Docker image installs only its own part, the closure of the
dependencies and the extras it runs (``IMAGE_EXTRAS``: the cache job, the server, the client, tf.data,
seqio, plot and dask, so that the image can be a Dask cluster's worker): every other line ends with
``# not in the image``, and the Dockerfile leaves those lines out.

    python deploy/lock.py            # rewrite requirements.lock
    python deploy/lock.py --check    # exit 1, saying what differs, if requirements.lock is not what this environment gives
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata as metadata
import os
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

__all__ = ["IMAGE_EXTRAS", "LOCK", "NOT_IN_IMAGE", "closure", "declared_requirements", "differences", "lock_text"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCK = os.path.join(ROOT, "requirements.lock")
IMAGE_EXTRAS = ("cache", "server", "client", "tf", "seqio", "plot", "dask")
NOT_IN_IMAGE = "# not in the image"


def declared_requirements(extras: tuple[str, ...] | None = None) -> list[Requirement]:
    """taskdata's dependencies and those of ``extras`` (every extra when None), as pyproject.toml declares them."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    optional = project["optional-dependencies"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    for extra in sorted(optional) if extras is None else extras:
        requirements += [Requirement(r) for r in optional[extra]]
    return requirements


def closure(roots: list[Requirement]) -> dict[str, str]:
    """name -> installed version for every distribution the roots need (markers for this interpreter)."""
    pinned: dict[str, str] = {}
    queue = [(r, frozenset[str]()) for r in roots]
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
                f"{requirement.name} is required but not installed here; install '.[test]' first."
            ) from None
        if name != "taskdata":  # an extra that names others ('taskdata[client]') is followed, not pinned
            pinned[name] = dist.version
        for child in dist.requires or []:
            queue.append((Requirement(child), frozenset(requirement.extras)))
    return dict(sorted(pinned.items()))


def lock_text() -> str:
    """What requirements.lock holds when written from this environment."""
    everything = closure(declared_requirements())
    image = closure(declared_requirements(IMAGE_EXTRAS))
    header = (
        "# Exact versions of everything taskdata and its extras install (the test extra installs them all),\n"
        "# written by deploy/lock.py from the environment the tests passed in: Python "
        f"{sys.version_info.major}.{sys.version_info.minor}, linux x86_64.\n"
        "# CI installs with -c requirements.lock; the Docker image installs the lines not marked\n"
        f"# '{NOT_IN_IMAGE}' (the dependencies and the extras {', '.join(IMAGE_EXTRAS)}).\n"
    )
    return header + "".join(
        f"{name}=={version}\n" if name in image else f"{name}=={version}  {NOT_IN_IMAGE}\n"
        for name, version in everything.items()
    )


def differences(locked: str, wanted: str) -> list[str]:
    """The lines that differ between the lock as written and as this environment gives it (a unified diff)."""
    diff = difflib.unified_diff(locked.splitlines(), wanted.splitlines(), "requirements.lock", "this environment",
                                lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("---", "+++"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if requirements.lock is not what this environment gives (and say what differs)")
    args = parser.parse_args()
    text = lock_text()
    if args.check:
        with open(LOCK) as f:
            changed = differences(f.read(), text)
        print("\n".join(changed) or "requirements.lock is this environment")
        return 1 if changed else 0
    with open(LOCK, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
