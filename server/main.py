"""The FastAPI app: ``create_app()`` (``taskdata serve`` runs it under uvicorn; ``app`` for ``uvicorn server.main:app``).

Settings come from ``create_app(settings)`` (the CLI), else from the cached ``server.settings.get_settings``,
which tests may swap with ``app.dependency_overrides[get_settings]``. They are read once, when the app's
state is built (at start up, or on the first request if the app is used without its lifespan), not on
every request.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from server.auth import RequestGuard, document_bearer_token
from server.metrics import Metrics, MetricsMiddleware
from server.routers import health, ledger, metrics, runs, shards, tasks
from server.settings import Settings
from server.state import ServerConfigError, state_of
from taskdata.cas import ContentionError
from taskdata.define.registry import Registry, UnknownNameError
from taskdata.index import PlanError
from taskdata.names import InvalidNameError
from taskdata.runs import CacheUnavailableError, RunConflictError, RunError

__all__ = ["app", "create_app"]

API_VERSION = "1"


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state_of(app)  # bad settings (runs file, default run) stop the server at start, not at a request
    gc.freeze()  # modules, registry and plans live as long as the process: keep them out of full collections
    yield


def _error(status: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handler(request: Request, error: Exception) -> JSONResponse:
        state = request.app.state.server  # None if building it failed (ServerConfigError)
        detail = str(error) if state is None else state.resolver.relative(str(error))
        return JSONResponse({"detail": detail}, status_code=status)

    return handler


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


async def _method_not_allowed_lists_every_method(request: Request, error: Exception) -> Response:
    # Starlette answers 405 with the methods of one route; GET and POST /runs are two routes of one path.
    # Each method is tried against the router: included routers are not flat lists of routes to read.
    assert isinstance(error, StarletteHTTPException)
    if error.status_code != 405:
        return await http_exception_handler(request, error)
    routes = request.app.router.routes
    allowed = [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)
    ]
    return JSONResponse({"detail": error.detail}, status_code=405, headers={"Allow": ", ".join(allowed)})


def create_app(settings: Settings | None = None, registry: Registry | None = None) -> FastAPI:
    """The app; ``settings`` default to the environment's, ``registry`` to the default one plus settings.modules."""
    app = FastAPI(
        title="taskdata assignment service",
        version=API_VERSION,
        description="Which cache records every trainer host reads at every step of a deterministic run. Every "
        "answer is a pure function of the run plan and the cache bytes it pins: any replica, before or "
        "after a restart, returns the same bytes.",
        lifespan=_lifespan,
        openapi_url=None,  # served below, behind the token like every route but /healthz
        docs_url=None,
        redoc_url=None,
    )
    app.state.registry = registry
    app.state.server = None
    app.state.metrics = Metrics()
    # Not app.dependency_overrides: while that holds anything, FastAPI re-analyses every dependency
    # of every request (measured: +0.4 ms per /shards answer). Tests may still override get_settings.
    app.state.settings = settings
    for module in (health, shards, runs, ledger, tasks, metrics):
        app.include_router(module.router)
    # FastAPI's way to extend the schema it generates: the token that RequestGuard checks, documented.
    app.openapi = lambda: document_bearer_token(FastAPI.openapi(app))  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)  # behind the token like every route but /healthz
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    # Most specific first is not needed: Starlette picks the handler of the closest class in the MRO.
    app.add_exception_handler(StarletteHTTPException, _method_not_allowed_lists_every_method)
    app.add_exception_handler(RunConflictError, _error(409))
    app.add_exception_handler(RunError, _error(400))
    app.add_exception_handler(PlanError, _error(400))
    app.add_exception_handler(InvalidNameError, _error(400))
    app.add_exception_handler(UnknownNameError, _error(404))
    app.add_exception_handler(CacheUnavailableError, _error(503))
    app.add_exception_handler(ContentionError, _error(503))  # a run record other writers kept changing
    app.add_exception_handler(ServerConfigError, _error(500))
    # The last added runs first: metrics see every answer, the guard's refusals included.
    app.add_middleware(RequestGuard)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app


app = create_app()
