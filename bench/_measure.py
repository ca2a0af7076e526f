"""Running a job in a subprocess and measuring it: wall time, CPU time of the whole process tree, and
(optionally) its peak resident memory, sampled from /proc."""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time

_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_tree(root: int) -> set[int]:
    """``root`` and the pids of all its descendants, from /proc."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        children = [c for c, p in parents.items() if p == pid]
        tree.update(children)
        frontier.extend(children)
    return tree


def tree_rss(root: int) -> tuple[int, int]:
    """(sum, max) resident bytes over ``root`` and all its descendants."""
    sizes = []
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/statm") as f:
                sizes.append(int(f.read().split()[1]) * _PAGE)
        except OSError:
            continue
    return sum(sizes), max(sizes, default=0)


def run_measured(command: list[str], env: dict[str, str], *, what: str, sample_rss: bool = True,
                 cwd: str | None = None) -> dict:
    """Runs ``command`` to its end: ``seconds`` (wall), ``cpu`` (user + system of it and every descendant),
    ``stdout``, ``stderr`` and, with ``sample_rss``, ``peak_tree_rss`` and ``peak_process_rss`` (bytes,
    sampled every 0.1 s; without it nothing runs beside the job). A failed job ends the bench, naming
    ``what`` and showing the end of its stderr. ``cwd``: the folder it runs in (``python -m`` and ``-c`` put it
    first on ``sys.path``, before ``PYTHONPATH``: run another checkout's code from inside that checkout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    peaks = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            total, largest = tree_rss(process.pid)
            peaks[0], peaks[1] = max(peaks[0], total), max(peaks[1], largest)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    if sample_rss:
        sampler.start()
    stdout, stderr = process.communicate()
    seconds = time.monotonic() - started
    done.set()
    if sample_rss:
        sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"{what} failed:\n{stderr[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    measured = {"seconds": seconds, "cpu": cpu, "stdout": stdout, "stderr": stderr}
    if sample_rss:
        measured.update(peak_tree_rss=peaks[0], peak_process_rss=peaks[1])
    return measured
