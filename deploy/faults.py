"""Runs the fault drills: every module of ``deploy/fault_drills/`` with a list ``DRILLS`` of (name, callable).

    python deploy/faults.py                      # every drill, full size
    python deploy/faults.py --only server-       # the drills whose name starts with 'server-'
    python deploy/faults.py --json figures.json  # also write every drill's figures

Each drill returns a dict of figures whose ``ok`` says whether its expectations held; one line of
JSON per drill is printed, and the exit status is 1 if any drill is not ok (or raised).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def drills() -> list[tuple[str, object]]:
    import deploy.fault_drills as package

    found = []
    for module in pkgutil.iter_modules(package.__path__):
        found += getattr(importlib.import_module(f"deploy.fault_drills.{module.name}"), "DRILLS", [])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="", help="run only the drills whose name starts with this")
    parser.add_argument("--json", help="write {drill: figures} to this file")
    args = parser.parse_args(argv)
    results = {}
    for name, drill in drills():
        if not name.startswith(args.only):
            continue
        started = time.monotonic()
        try:
            figures = drill()
        except Exception as error:
            figures = {
                "ok": False,
                "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc(),
            }
        figures["seconds"] = round(time.monotonic() - started, 1)
        results[name] = figures
        print(json.dumps({"drill": name, **figures}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if results and all(figures.get("ok") for figures in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
