"""Runs the fault drills: every ``DRILLS`` list of every module in ``deploy/fault_drills/``.

    python deploy/faults.py                      # every drill, full size (tens of minutes)
    python deploy/faults.py --list               # the drills' names
    python deploy/faults.py --only cache-byte-flips --only cache-structural-damage
    python deploy/faults.py --json-out drills.json

A drill module exposes ``DRILLS``, a list of (name, callable) pairs; the callable takes no arguments
(its keyword arguments set its size; the tests call the same functions smaller), runs one bounded drill
on loopback or local files only, and returns a dict of counts and figures. This runner prints each
result as JSON with its duration and the machine it ran on, and exits 1 if a drill raised. Judging the
counts (e.g. 1000 of 1000 flips detected) is the reader's: RELIABILITY.md records them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import platform
import sys
import time
import traceback
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)  # run as a script from a checkout: the package need not be installed

__all__ = ["discover", "main"]

DRILLS_PACKAGE = "deploy.fault_drills"


def discover() -> list[tuple[str, Callable[[], dict]]]:
    """Every (name, callable) of every drill module, modules in name order; helpers (``_x``) skipped."""
    package = importlib.import_module(DRILLS_PACKAGE)
    drills: list[tuple[str, Callable[[], dict]]] = []
    for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")):
        loaded = importlib.import_module(f"{DRILLS_PACKAGE}.{module}")
        for name, function in getattr(loaded, "DRILLS", []):
            if any(name == seen for seen, _ in drills):
                raise ValueError(f"Two drills are named {name!r}; drill names must be unique.")
            drills.append((name, function))
    return drills


def machine() -> str:
    return f"{platform.node()}: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run only this drill (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the drills and exit")
    parser.add_argument("--json-out", metavar="FILE", help="also write every result to FILE as JSON")
    args = parser.parse_args(argv)
    drills = discover()
    if args.list:
        print("\n".join(name for name, _ in drills))
        return 0
    unknown = sorted(set(args.only) - {name for name, _ in drills})
    if unknown:
        parser.error(f"unknown drills {unknown}; --list shows them")
    chosen = [(n, f) for n, f in drills if not args.only or n in args.only]
    results: dict[str, dict] = {}
    failed = 0
    print(f"# {machine()}", flush=True)
    for name, function in chosen:
        started = time.monotonic()
        try:
            result = {"counts": function(), "seconds": None}
        except Exception as error:  # a drill that cannot run is reported, and the others still run
            failed += 1
            result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc(), "seconds": None}
        result["seconds"] = round(time.monotonic() - started, 1)
        results[name] = result
        print(json.dumps({name: {k: v for k, v in result.items() if k != "traceback"}}, sort_keys=True), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"machine": machine(), "command": " ".join(sys.argv), "results": results}, f, indent=1,
                      sort_keys=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
