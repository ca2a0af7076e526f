"""The server's state, built once per app from its settings: runs, the cache resolver and caches.

Runs come from two places: the runs file of the settings (read-only, loaded at start) and the cache
root's ``_runs/`` folder (``POST /runs``, ``taskdata plan``), shared by every replica. A name means one
plan in both; a conflict between them stops the server at start. A stored run may gain stages while the
server runs (``POST /runs/{run}/stages`` on any replica, ``taskdata plan --add-stage``): the store reads
its file again every ``run_refresh_seconds``, and before it answers a step at or after the stored run's
``served_before`` it raises that in the run's record (``RunStore.reserve``), so that no stage appended later
can change a step any replica answered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, HTTPException, Request

from server.assignments import AnswerCache
from server.settings import Settings, get_settings
from taskdata.cache.reader import CacheReader
from taskdata.define.registry import Registry
from taskdata.names import InvalidNameError, validate_name
from taskdata.runs import CacheResolver, ResolvedCache, RunError, RunStore, StoredRun, TaskCacheView

__all__ = ["ServerConfigError", "ServerState", "build_state", "first_use", "get_state", "state_of"]

_RETRY_AFTER_SECONDS = 5


class ServerConfigError(ValueError):
    """Settings that cannot be served (bad runs file, unknown default run, conflicting plans)."""


@dataclasses.dataclass(frozen=True)
class ServerState:
    settings: Settings
    registry: Registry
    store: RunStore
    resolver: CacheResolver
    configured: dict[str, StoredRun]
    default_run: str | None
    answers: AnswerCache
    # Runs whose caches are being found and verified (first use), by run name.
    _pending: dict[str, Future] = dataclasses.field(default_factory=dict, repr=False)
    _pending_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    # Ledger and summary readers of verified cache versions, by (version folder, split); kept open.
    _views: dict[tuple[str, str], TaskCacheView] = dataclasses.field(default_factory=dict, repr=False)

    def views(self, caches: tuple[ResolvedCache, ...]) -> dict[str, TaskCacheView]:
        """The ledger's view of each of a run's resolved (verified) caches, by task; opened once each."""
        out = {}
        for cache in caches:
            key = (cache.version_dir, cache.split)
            with self._pending_lock:
                view = self._views.get(key)
                if view is None:
                    reader = CacheReader(cache.version_dir, expected_manifest_sha256=cache.fingerprint)
                    view = self._views[key] = TaskCacheView(reader, cache.split, byte_ranges=cache.byte_ranges)
            out[cache.task] = view
        return out

    def resolving(self, run: StoredRun) -> Future:
        """The resolution of ``run``'s caches, started in a daemon thread unless one is under way.

        The thread is not tied to any request: a request that stops waiting leaves it running, and a
        server shutdown does not wait for a long verification.
        """
        with self._pending_lock:
            future = self._pending.get(run.name)
            if future is None:
                future = self._pending[run.name] = Future()
                threading.Thread(
                    target=self._resolve_into, args=(run, future), name=f"verify-{run.name}", daemon=True
                ).start()
            return future

    def _resolve_into(self, run: StoredRun, future: Future) -> None:
        try:
            caches = self.resolver.resolve_run(run)
            # A 65,536-shard cache has ~1 s of URIs to encode: done here, not in a request.
            self.answers.prepare(run, caches)
            # The resolved caches live as long as the process (hundreds of thousands of objects for
            # 65,536-shard caches): frozen, they are out of the collector's full passes, which would
            # otherwise stop every request for 100+ ms now and then.
            gc.freeze()
            future.set_result(caches)
        except BaseException as error:  # handed to every waiting request, which turns it into an answer
            future.set_exception(error)
        finally:
            # Done either way: the resolver remembers successes and verification failures, and a
            # missing version is looked up again by the next request.
            with self._pending_lock:
                self._pending.pop(run.name, None)

    def find_run(self, name: str | None) -> tuple[StoredRun, Literal["config", "store"]]:
        """The run called ``name`` (default: the default run); HTTP 400/404 naming what exists otherwise."""
        if name is None:
            if self.default_run is None:
                raise HTTPException(
                    400,
                    f"Query parameter 'run' is required: this server has no default run (runs: "
                    f"{self._known_names()}). Add run=<name>, or start the server with --default-run.",
                )
            name = self.default_run
        run = self.configured.get(name)
        if run is not None:
            return run, "config"
        try:
            validate_name(name, kind="run")
            stored = self.store.get(name)
        except (InvalidNameError, RunError) as error:
            raise HTTPException(400, self.resolver.relative(str(error))) from None
        if stored is None:
            raise HTTPException(
                404,
                f"Unknown run {name!r}; known runs: {self._known_names()}. Create it with "
                "POST /runs or 'taskdata plan'.",
            )
        return stored, "store"

    def run_names(self) -> list[tuple[str, Literal["config", "store"]]]:
        names: list[tuple[str, Literal["config", "store"]]] = [(n, "config") for n in sorted(self.configured)]
        names += [(n, "store") for n in self.store.names() if n not in self.configured]
        return names

    def _known_names(self) -> list[str]:
        return [name for name, _ in self.run_names()]


async def first_use(state: ServerState, run: StoredRun) -> tuple[ResolvedCache, ...]:
    """Every cache of ``run``, found and verified in a background thread (once per process).

    Verifying a large cache takes minutes; rather than hold the request that long, the answer after
    ``first_use_wait_seconds`` is 503 with Retry-After while the thread carries on, and a later request
    gets the result.
    """
    future = asyncio.wrap_future(state.resolving(run))
    # If every waiter has given up, nobody reads a failure: mark it read (it is remembered elsewhere).
    future.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        # shield: a request that stops waiting must not cancel the resolution others wait for.
        return await asyncio.wait_for(asyncio.shield(future), state.settings.first_use_wait_seconds)
    except TimeoutError:
        raise HTTPException(
            503,
            f"The caches of run {run.name!r} are being verified (first use since this server started); retry "
            f"in a few seconds.",
            headers={"Retry-After": str(_RETRY_AFTER_SECONDS)},
        ) from None


def build_state(settings: Settings, registry: Registry | None = None) -> ServerState:
    """State for ``settings``; ``registry`` defaults to the default registry plus ``settings.modules``."""
    if registry is None:
        from taskdata.tasks import default_registry

        registry = default_registry(settings.config())
        for module in settings.modules:
            registry.load_module(module)
    # One spelling of the root everywhere (absolute), so that every message can be made relative to it.
    resolver = CacheResolver(
        settings.cache_root, level=settings.first_use_check, workers=settings.verify_workers
    )
    store = RunStore(resolver.cache_root, refresh_seconds=settings.run_refresh_seconds)
    configured = _load_runs_file(settings.runs_file) if settings.runs_file else {}
    for name, run in configured.items():
        try:
            stored = store.get(name)
        except RunError as error:
            raise ServerConfigError(f"Run {name!r} of {settings.runs_file}: {error}") from None
        if stored is not None and stored.plan.to_dict() != run.plan.to_dict():
            raise ServerConfigError(
                f"Run {name!r} of {settings.runs_file} differs from the stored run {store.path(name)} (fingerprints "
                f"{run.plan.fingerprint()} and {stored.plan.fingerprint()}). A name means one plan: rename one."
            )
    default_run = settings.default_run
    if default_run is None and len(configured) == 1:
        default_run = next(iter(configured))
    if default_run is not None and default_run not in configured and store.get(default_run) is None:
        raise ServerConfigError(
            f"Default run {default_run!r} is neither in the runs file nor stored under {settings.cache_root}; "
            f"runs: {sorted(configured) + store.names()}."
        )
    return ServerState(
        settings=settings,
        registry=registry,
        store=store,
        resolver=resolver,
        configured=configured,
        default_run=default_run,
        answers=AnswerCache(settings.step_cache_entries),
    )


def _load_runs_file(path: str) -> dict[str, StoredRun]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise ServerConfigError(f"Cannot read the runs file {path}: {error.strerror}.") from None
    except ValueError as error:
        raise ServerConfigError(f"The runs file {path} is not valid JSON: {error}.") from None
    if not isinstance(data, list):
        raise ServerConfigError(
            f"The runs file {path} must hold a JSON list of run plans, not a {type(data).__name__}."
        )
    runs: dict[str, StoredRun] = {}
    for i, entry in enumerate(data):
        try:
            run = StoredRun.from_dict(entry, where=f"{path}, entry {i}")
        except RunError as error:
            raise ServerConfigError(str(error)) from None
        if run.name in runs:
            raise ServerConfigError(
                f"The runs file {path} names run {run.name!r} twice (entry {i}); names are unique."
            )
        runs[run.name] = run
    return runs


_build_lock = threading.Lock()


def state_of(app: FastAPI) -> ServerState:
    """The app's state, built on first use from its (possibly overridden) settings."""
    state = getattr(app.state, "server", None)
    if state is None:
        with _build_lock:
            state = getattr(app.state, "server", None)
            if state is None:
                override = app.dependency_overrides.get(get_settings)
                settings = override() if override else (app.state.settings or get_settings())
                state = app.state.server = build_state(settings, app.state.registry)
    return state


async def get_state(request: Request) -> ServerState:
    # async and attribute-only: a sync dependency would cost a thread-pool round trip per request.
    state = getattr(request.app.state, "server", None)
    return state if state is not None else state_of(request.app)
