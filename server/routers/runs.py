"""``/runs``: list, describe and create training runs (created runs are stored in the cache root)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Depends, HTTPException, Path, Response

from server.models import NAME_PATTERN, ErrorResponse, RunCreate, RunDetail, RunList
from server.state import ServerState, get_state
from taskdata.index import BatchSchedule, PlanError, SkipRange
from taskdata.runs import RunConflictError, StoredRun, build_run

__all__ = ["router"]

router = APIRouter(tags=["runs"])

# FastAPI's type of a route's extra OpenAPI responses (free-form JSON objects).
_AUTH: dict[int | str, dict[str, Any]] = {401: {"model": ErrorResponse, "description": "Missing or invalid bearer token."}}
_NAME_ERRORS: dict[int | str, dict[str, Any]] = {
    **_AUTH,
    400: {"model": ErrorResponse, "description": "Invalid run name."},
    404: {"model": ErrorResponse, "description": "Unknown run."},
}
_CREATE_ERRORS: dict[int | str, dict[str, Any]] = {
    **_AUTH,
    400: {"model": ErrorResponse, "description": "A plan that breaks a rule (the message says which)."},
    404: {"model": ErrorResponse, "description": "Unknown task or mixture."},
    409: {"model": ErrorResponse, "description": "A different plan already exists under this name."},
    503: {"model": ErrorResponse, "description": "A task of the mixture has no complete cache."},
}


def _summary(run: StoredRun, source: Literal["config", "store"]) -> dict[str, Any]:
    plan = run.plan
    return {
        "name": plan.name,
        "mixture": plan.mixture,
        "fingerprint": plan.fingerprint(),
        "split": run.split,
        "num_data_shards": plan.num_data_shards,
        "tasks": list(plan.task_names),
        "source": source,
    }


def _detail(run: StoredRun, source: Literal["config", "store"]) -> dict[str, Any]:
    plan = run.plan
    shards = plan.num_data_shards
    return {
        "name": plan.name,
        "fingerprint": plan.fingerprint(),
        "split": run.split,
        "source": source,
        "plan": plan.to_dict(),
        "hosts": {
            "num_data_shards": shards,
            "rule": f"host h of num_hosts H reads data shard h // (H / {shards}) if H is a multiple of {shards}, "
            f"data shards h * {shards} / H to (h + 1) * {shards} / H - 1 as one slice if H divides {shards}; the "
            "global batch does not depend on H.",
            "valid_num_hosts": f"any multiple or divisor of {shards} (GET /shards?num_hosts=H; default {shards})",
        },
        "examples_per_data_shard": {
            "start": plan.schedule.start // shards,
            "end": plan.schedule.end // shards,
        },
    }


@router.get("/runs", response_model=RunList, responses=_AUTH, summary="Every run this server knows")
async def list_runs(state: Annotated[ServerState, Depends(get_state)]) -> dict[str, Any]:
    runs = [_summary(*state.find_run(name)) for name, _ in state.run_names()]
    return {"runs": runs}


@router.get("/runs/{name}", response_model=RunDetail, responses=_NAME_ERRORS, summary="One run's plan")
async def get_run(
    state: Annotated[ServerState, Depends(get_state)],
    name: Annotated[str, Path(min_length=1, max_length=200, pattern=NAME_PATTERN)],
) -> dict[str, Any]:
    return _detail(*state.find_run(name))


@router.post(
    "/runs",
    response_model=RunDetail,
    status_code=201,
    responses={**_CREATE_ERRORS, 200: {"model": RunDetail, "description": "The same run already existed."}},
    summary="Create a run over the current caches of a task or mixture (idempotent)",
)
async def create_run(
    state: Annotated[ServerState, Depends(get_state)], body: RunCreate, response: Response
) -> dict[str, Any]:
    try:
        schedule = BatchSchedule(
            start=body.schedule.start,
            end=body.schedule.start if body.schedule.end is None else body.schedule.end,
            ramp_steps=body.schedule.ramp_steps,
            multiple_of=body.schedule.multiple_of,
        )
        skip = tuple(SkipRange(start, stop) for start, stop in body.skip)
    except PlanError as error:
        raise HTTPException(400, str(error)) from None

    def create() -> tuple[StoredRun, bool]:
        run = build_run(
            state.registry,
            state.resolver.cache_root,
            name=body.name,
            mixture=body.mixture,
            seed=body.seed,
            schedule=schedule,
            num_data_shards=body.num_data_shards,
            skip=skip,
            split=body.split,
        )
        configured = state.configured.get(run.name)
        if configured is not None:
            if configured.to_dict() != run.to_dict():
                raise RunConflictError(
                    f"Run {run.name!r} is configured in the runs file with a different plan (fingerprint "
                    f"{configured.plan.fingerprint()}; this one has {run.plan.fingerprint()}). Choose another name."
                )
            return configured, False
        return run, state.store.create(run)

    # Reading manifests (and writing the run) is file I/O: keep it off the event loop.
    run, created = await anyio.to_thread.run_sync(create)
    if not created:
        response.status_code = 200
    return _detail(run, "config" if run.name in state.configured else "store")
