"""``/runs/{name}/ledger`` and ``/runs/{name}/summary``: what a run read, and where it stands.

The ledger answers the two questions of ``taskdata ledger`` (``taskdata.runs.ledger``): the examples
of a step (or of one host's slice: what ``/shards`` hands that host, record for record) with their
stable ids and provenance; or the steps at which one example is read. The summary is ``taskdata
summary``. Both read the run's verified caches (record provenance, statistics), so they run in a worker
thread, after the run's first verification like ``/shards``; their bounds are those of ``/shards``.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Depends, HTTPException, Query

from server.models import (
    ErrorResponse,
    ExampleLedgerResponse,
    LedgerQuery,
    PathName,
    StepLedgerResponse,
    SummaryQuery,
    SummaryResponse,
)
from server.state import ServerState, first_use, get_state
from taskdata.index import PlanError
from taskdata.runs import ExampleLedger, LedgerError, StepLedger, example_ledger, step_ledger, summarize

__all__ = ["router"]

router = APIRouter(tags=["runs"])

# FastAPI's type of a route's extra OpenAPI responses (free-form JSON objects).
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "A question the run cannot answer (the message says why)."},
    401: {"model": ErrorResponse, "description": "Missing or invalid bearer token."},
    404: {"model": ErrorResponse, "description": "Unknown run."},
    503: {
        "model": ErrorResponse,
        "description": "A cache of the run is missing, incomplete, fails verification, or is being verified "
        "(first use; with Retry-After).",
    },
}



@router.get(
    "/runs/{name}/ledger",
    response_model=StepLedgerResponse | ExampleLedgerResponse,
    responses=_ERRORS,
    summary="The examples of a step (with their stable ids and sources), or the steps that read an example",
)
async def get_ledger(
    state: Annotated[ServerState, Depends(get_state)], name: PathName, query: Annotated[LedgerQuery, Query()]
) -> dict[str, Any]:
    stored, _ = state.find_run(name)
    caches = state.resolver.cached(stored) or await first_use(state, stored)

    def answer() -> dict[str, Any]:
        views = state.views(caches)
        ledger: StepLedger | ExampleLedger
        if query.step is not None:
            ledger = step_ledger(stored.plan, views, query.step, host=query.host, num_hosts=query.num_hosts)
        else:
            assert query.example is not None
            ledger = example_ledger(
                stored.plan, views, query.example, from_step=query.from_step, until_step=query.until_step,
                limit=query.limit,
            )
        return ledger.to_dict()

    try:
        return await anyio.to_thread.run_sync(answer)
    except (LedgerError, PlanError) as error:
        raise HTTPException(400, state.resolver.relative(str(error))) from None


@router.get("/runs/{name}/summary", response_model=SummaryResponse, responses=_ERRORS,
            summary="Where a run stands before a step: per task, per host, the stage in force")
async def get_summary(
    state: Annotated[ServerState, Depends(get_state)], name: PathName, query: Annotated[SummaryQuery, Query()]
) -> dict[str, Any]:
    stored, _ = state.find_run(name)
    caches = state.resolver.cached(stored) or await first_use(state, stored)
    try:
        return await anyio.to_thread.run_sync(lambda: summarize(stored.plan, state.views(caches), query.step))
    except PlanError as error:
        raise HTTPException(400, str(error)) from None
