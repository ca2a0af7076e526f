"""Training runs next to their caches: plans stored in the cache root, and the verified caches they pin."""

from taskdata.runs.resolver import CacheResolver, ResolvedCache
from taskdata.runs.store import (
    RUNS_DIR,
    CacheUnavailableError,
    RunConflictError,
    RunError,
    RunStore,
    StoredRun,
    build_run,
    cache_fingerprint,
)

__all__ = [
    "RUNS_DIR",
    "CacheResolver",
    "CacheUnavailableError",
    "ResolvedCache",
    "RunConflictError",
    "RunError",
    "RunStore",
    "StoredRun",
    "build_run",
    "cache_fingerprint",
]
