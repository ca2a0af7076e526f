"""``CacheRun``: a stored run and its cache root, as a small picklable value that opens the run's source.

The torch datasets take a zero-argument callable that opens an ``AssignmentSource``, because a source holds
open files and cannot travel to another process: each process that reads (the trainer's, each ``DataLoader``
worker) calls it once. ``CacheRun(cache_root, run)`` is that callable for a run stored under a cache root
(``taskdata plan --name RUN``); ``functools.partial(ServerAssignments, url, run, token=...)`` is the one for
a run read through the assignment server.
"""

from __future__ import annotations

import dataclasses

from taskdata.runs import RunStore
from trainer_client.local_source import LocalAssignments

__all__ = ["CacheRun"]


@dataclasses.dataclass(frozen=True)
class CacheRun:
    """Opens ``LocalAssignments`` for the run named ``run`` stored under ``cache_root`` (local or gs://)."""

    cache_root: str
    run: str

    def __post_init__(self) -> None:
        for field in ("cache_root", "run"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise ValueError(f"CacheRun.{field} must be a non-empty string but got {value!r}.")

    def __call__(self) -> LocalAssignments:
        store = RunStore(self.cache_root)
        stored = store.get(self.run)
        if stored is None:
            raise ValueError(
                f"No run named {self.run!r} is stored under {self.cache_root} (runs: {store.names() or 'none'}). "
                "Create it with 'taskdata plan --name ...', or name one of those."
            )
        return LocalAssignments.from_cache_root(stored, self.cache_root)
