"""What each process fed MaxText, step by step, and the global batch hashes it adds up to.

Every process appends one JSON line per step to ``{folder}/process_{i}.jsonl``: the kind (``train`` or
``eval``), the step, the eval pass (0 for training), and for every run of the plan's rows it read, the first
stream position and the ``digest.row_digests`` of its rows (the rows as read from the cache, before padding and
before MaxText's fields are made). ``read_batch_hashes`` puts the processes' rows back in position order and
hashes each step with ``digest.batch_hash``: the same hash whatever the number of processes, and the one the
example trainer and the ledger give the same records. A restarted process appends to its file; for a step
logged twice by one process the last line counts (the one the surviving checkpoint descends from).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

import numpy as np

from trainer_client.digest import DIGEST_BYTES, batch_hash
from trainer_client.example.batch_log import BatchLog, read_batch_log_lines

__all__ = ["StepLog", "read_batch_hashes"]


class StepLog:
    """Appends this process's entries to ``{folder}/process_{process}.jsonl``."""

    def __init__(self, folder: str, process: int):
        self._log = BatchLog(os.path.join(folder, f"process_{process}.jsonl"))

    def write(self, kind: str, step: int, eval_pass: int, runs: Sequence[tuple[int, np.ndarray]]) -> None:
        """``runs``: (first stream position, ``[rows, 32]`` row digests) of every run of rows read at ``step``."""
        self._log.write({
            "kind": kind,
            "step": step,
            "pass": eval_pass,
            "rows": [[first, len(digests)] for first, digests in runs],
            "digests": [bytes(row).hex() for _, digests in runs for row in digests],
        })

    def close(self) -> None:
        self._log.close()


def read_batch_hashes(folder: str) -> dict[tuple[str, int, int], str | None]:
    """(kind, eval pass, step) -> the hash of the step's global batch as the processes logged it in ``folder``
    (None for a step whose data the plan skips). The processes' rows must cover one run of positions exactly."""
    rows: dict[tuple[str, int, int], dict[int, bytes]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "process_*.jsonl"))):
        last = {(e["kind"], e["pass"], e["step"]): e for e in read_batch_log_lines(path)}
        for key, entry in last.items():
            found = rows.setdefault(key, {})
            digests = iter(entry["digests"])
            for first, count in entry["rows"]:
                for position in range(first, first + count):
                    if position in found:
                        raise ValueError(f"{key}: position {position} was logged by two processes ({path}).")
                    found[position] = bytes.fromhex(next(digests))
    hashes: dict[tuple[str, int, int], str | None] = {}
    for key, found in sorted(rows.items()):
        if not found:
            hashes[key] = None
            continue
        positions = sorted(found)
        if positions != list(range(positions[0], positions[0] + len(positions))):
            raise ValueError(f"{key}: the processes logged positions {positions}, not one run of them.")
        digests = np.frombuffer(b"".join(found[p] for p in positions), dtype=np.uint8).reshape(-1, DIGEST_BYTES)
        hashes[key] = batch_hash(digests)
    return hashes
