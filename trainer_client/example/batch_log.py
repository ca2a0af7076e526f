"""The batch log: one JSON line per trained (or skipped) step, so runs can be compared step by step.

Lines are appended with one ``write`` each. After a SIGKILL the log may end with steps that were
trained but never checkpointed (the restart trains them again and appends them again) and, in the
worst case, with a torn last line; ``BatchLog`` cuts a torn tail when it reopens the file, and
``read_batch_log`` keeps the last line of every step ("last write wins": the entry that the run's
surviving parameters actually descend from).
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["BatchLog", "read_batch_log", "read_batch_log_lines"]


class BatchLog:
    """Appends entries to ``path`` (created if missing)."""

    def __init__(self, path: str):
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.lseek(self._fd, 0, os.SEEK_END)
        if size:
            tail = os.pread(self._fd, min(size, 1 << 16), max(0, size - (1 << 16)))
            if not tail.endswith(b"\n"):
                # A line cut by a kill mid-write: drop it, its step is trained (and logged) again.
                keep = size - len(tail) + tail.rfind(b"\n") + 1
                os.ftruncate(self._fd, keep)

    def write(self, entry: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(entry, sort_keys=True) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def read_batch_log_lines(path: str) -> list[dict[str, Any]]:
    """Every complete entry, in the order written (a torn last line is left out)."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    return [json.loads(line) for line in lines[:-1]]


def read_batch_log(path: str) -> dict[int, dict[str, Any]]:
    """Step -> its last entry."""
    return {entry["step"]: entry for entry in read_batch_log_lines(path)}
