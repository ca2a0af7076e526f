"""What a trainer host installs: the light client against the client with everything it used to get.

Two fresh virtualenvs, one after the other, each ``pip install '<this tree>[EXTRAS]' -c requirements.lock``
(the versions the tests run with; pip's wheel cache as the machine has it, so the time is installing, not
downloading, once the cache is warm):

- **light**: ``[client]``, what a trainer host needs to read caches locally, on gs:// and through the server.
- **full**: ``[cache,server,client,tf]``, what ``pip install 'taskdata[client]'`` installed before the
  cache job, the server and TensorFlow became extras (Beam, TensorFlow and tensorflow-text included).
- **torch**: ``[torch]``, what a PyTorch trainer host installs (torch 2.13.0 CPU and torchdata, as the lock
  pins them; a torch range alone would take the registry's CUDA build).

For each: the wall time of the install, the size of the virtualenv (``du``), its number of distributions,
and whether apache_beam, tensorflow and tensorflow_text are installed. The 1-minute load average is
recorded before and after each install (the machine is shared).

    PYTHONPATH=. python bench/bench_install.py [--only torch] [--write]

``--only`` measures the named installs alone and writes them to their own section.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._report import write_section

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALLS = {"light": "client", "full": "cache,server,client,tf", "torch": "torch"}
HEAVY = ("apache_beam", "tensorflow", "tensorflow_text")


def load() -> float:
    return os.getloadavg()[0]


def measure(name: str, extras: str, folder: str) -> str:
    """Installs ``[extras]`` into a fresh virtualenv under ``folder``; the result line."""
    venv = os.path.join(folder, name)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    before = load()
    started = time.perf_counter()
    subprocess.run([python, "-m", "pip", "install", "--quiet", f"{REPO}[{extras}]", "-c",
                    os.path.join(REPO, "requirements.lock")], check=True)
    seconds = time.perf_counter() - started
    after = load()
    size = int(subprocess.run(["du", "-sk", venv], check=True, capture_output=True, text=True).stdout.split()[0])
    listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], check=True, capture_output=True,
                            text=True).stdout.split()
    probe = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m)))"
    heavy = subprocess.run([python, "-c", probe, *HEAVY], check=True, capture_output=True, text=True).stdout.split()
    return (f"{name} (`[{extras}]`): {seconds:.0f} s, {size / 1024:,.0f} MiB, {len(listed)} distributions; "
            f"of {', '.join(HEAVY)}: {', '.join(heavy) or 'none'} installed (load {before:.1f} before, "
            f"{after:.1f} after)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    parser.add_argument("--only", nargs="+", choices=sorted(INSTALLS), help="measure these installs alone")
    args = parser.parse_args()
    names = args.only or list(INSTALLS)
    lines = []
    with tempfile.TemporaryDirectory(prefix="bench_install_") as folder:
        for name in names:
            line = measure(name, INSTALLS[name], folder)
            print(line, flush=True)
            lines.append(line)
    if args.write:
        write_section("Trainer-host install" + (f" ({', '.join(names)})" if args.only else ""), lines)


if __name__ == "__main__":
    main()
