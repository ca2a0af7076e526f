"""Training runs next to their caches: plans stored in the cache root, the verified caches they pin, and
what a run read (its ledger) and where it stands (its summary)."""

from taskdata.runs.ledger import (
    ExampleLedger,
    LedgerEntry,
    LedgerError,
    StepLedger,
    TaskCacheView,
    example_ledger,
    open_views,
    step_ledger,
)
from taskdata.runs.resolver import CacheResolver, ResolvedCache
from taskdata.runs.store import (
    RUNS_DIR,
    CacheUnavailableError,
    RunChangedError,
    RunConflictError,
    RunError,
    RunStore,
    StoredRun,
    build_run,
    cache_fingerprint,
    default_epoch_order,
)
from taskdata.runs.summary import format_summary, summarize

__all__ = [
    "RUNS_DIR",
    "CacheResolver",
    "CacheUnavailableError",
    "ExampleLedger",
    "LedgerEntry",
    "LedgerError",
    "ResolvedCache",
    "RunChangedError",
    "RunConflictError",
    "RunError",
    "RunStore",
    "StepLedger",
    "StoredRun",
    "TaskCacheView",
    "build_run",
    "cache_fingerprint",
    "default_epoch_order",
    "example_ledger",
    "format_summary",
    "open_views",
    "step_ledger",
    "summarize",
]
