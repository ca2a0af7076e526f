"""Training checkpoints without pickle: one ``.npz`` of arrays plus a JSON sidecar that commits it.

    {dir}/step-000000120.npz    parameters and optimizer state (np.savez, loaded with allow_pickle=False)
    {dir}/step-000000120.json   {"format", "step", "run", "data": DataState, "npz_sha256", "arrays"}

Both files are written to a temporary name, flushed to disk and renamed; the JSON goes last and holds
the sha256 of the ``.npz``, so it is the commit marker: a kill at any moment leaves the previous
checkpoints intact and at most a stray temporary file (ignored, removed by the next save). The data
state is one step number plus the run fingerprint (``trainer_client.iterator.DataState``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainer_client.iterator import DataState

__all__ = ["Checkpoint", "CheckpointError", "latest_checkpoint", "list_checkpoints", "save_checkpoint"]

FORMAT = "trainer_client.example.checkpoint/1"
_NAME = re.compile(r"^step-(\d{9,})\.json$")
_TMP = ".tmp-"


class CheckpointError(RuntimeError):
    """A committed checkpoint that cannot be read as written; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    step: int
    run: str
    data: DataState
    arrays: Mapping[str, np.ndarray]


def _paths(directory: str, step: int) -> tuple[str, str]:
    stem = os.path.join(directory, f"step-{step:09d}")
    return stem + ".npz", stem + ".json"


def _write_atomic(path: str, write: Any) -> None:
    tmp = f"{path}{_TMP}{os.getpid()}"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def save_checkpoint(
    directory: str, step: int, run: str, data: DataState, arrays: Mapping[str, np.ndarray], keep: int = 2
) -> str:
    """Commits a checkpoint of ``arrays`` at ``step``; keeps the newest ``keep``. Returns the JSON path."""
    if data.step != step:
        raise CheckpointError(
            f"Checkpoint of step {step} holds a data state of step {data.step}; they must agree."
        )
    if keep < 1:
        raise ValueError(f"keep must be >= 1 but got {keep}: the checkpoint just written is always kept.")
    os.makedirs(directory, exist_ok=True)
    npz_path, json_path = _paths(directory, step)
    host = {name: np.asarray(value) for name, value in arrays.items()}
    bad = [name for name, value in host.items() if value.dtype == object]
    if bad:
        raise CheckpointError(f"Arrays {bad} have dtype object, which cannot be stored without pickle.")
    _write_atomic(npz_path, lambda f: np.savez(f, **host))
    meta = {
        "format": FORMAT,
        "step": step,
        "run": run,
        "data": data.to_dict(),
        "npz_sha256": _sha256_file(npz_path),
        "arrays": {name: [str(value.dtype), list(value.shape)] for name, value in sorted(host.items())},
    }
    _write_atomic(json_path, lambda f: f.write((json.dumps(meta, indent=1, sort_keys=True) + "\n").encode()))
    _sync_directory(directory)
    for old in list_checkpoints(directory)[:-keep]:
        old_npz, old_json = _paths(directory, old)
        os.remove(old_json)  # the marker first: a half-removed checkpoint is never taken for a whole one
        if os.path.exists(old_npz):
            os.remove(old_npz)
    for name in os.listdir(directory):
        if _TMP in name and not name.endswith(f"{_TMP}{os.getpid()}"):
            os.remove(os.path.join(directory, name))  # left by a writer that was killed
    return json_path


def list_checkpoints(directory: str) -> list[int]:
    """Steps of the committed checkpoints in ``directory``, oldest first."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(directory) if (m := _NAME.match(name)))


def latest_checkpoint(directory: str, step: int | None = None) -> Checkpoint | None:
    """The newest committed checkpoint (or the one of ``step``), verified; None if there is none."""
    steps = list_checkpoints(directory)
    if not steps:
        return None
    chosen = steps[-1] if step is None else step
    npz_path, json_path = _paths(directory, chosen)
    try:
        with open(json_path, "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"Checkpoint marker {json_path} cannot be read ({error}). Delete it to resume from the previous "
            "checkpoint."
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("step") != chosen:
        raise CheckpointError(f"{json_path} is not a {FORMAT} marker of step {chosen}.")
    if not os.path.exists(npz_path) or _sha256_file(npz_path) != meta["npz_sha256"]:
        raise CheckpointError(
            f"{npz_path} does not match the sha256 its marker {json_path} commits: the file was changed or "
            "damaged after it was written. Restore it, or delete both files to resume from the previous checkpoint."
        )
    with np.load(npz_path, allow_pickle=False) as loaded:
        arrays = {name: loaded[name] for name in loaded.files}
    expected = meta["arrays"]
    got = {name: [str(value.dtype), list(value.shape)] for name, value in arrays.items()}
    if got != expected:
        raise CheckpointError(f"{npz_path} holds arrays {got} but its marker lists {expected}.")
    return Checkpoint(chosen, meta["run"], DataState.from_dict(meta["data"]), arrays)


def _sync_directory(directory: str) -> None:
    # The renames are durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
