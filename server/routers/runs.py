"""``/runs``: list, describe and create training runs (created runs are stored in the cache root), and
append stages to stored runs."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Annotated, Any, Literal, cast

import anyio.to_thread
from fastapi import APIRouter, Depends, HTTPException, Response

from server.models import (
    ErrorResponse,
    PathName,
    RunCreate,
    RunDetail,
    RunList,
    ScheduleRequest,
    StageRequest,
)
from server.state import ServerState, get_state
from taskdata.index import BatchSchedule, PlanError, SkipRange, Stage
from taskdata.runs import RunConflictError, RunError, StoredRun, build_run

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
    503: {"model": ErrorResponse, "description": "A task of the mixture has no complete cache, or other writers kept "
          "changing the run's record (nothing stored)."},
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
            "start": plan.batch_size(0) // shards,
            "end": plan.staged_schedule.schedules[-1].end // shards,
        },
        "served_before": run.served_before,
    }


def _schedule(request: ScheduleRequest) -> BatchSchedule:
    return BatchSchedule(
        start=request.start,
        end=request.start if request.end is None else request.end,
        ramp_steps=request.ramp_steps,
        multiple_of=request.multiple_of,
    )


@router.get("/runs", response_model=RunList, responses=_AUTH, summary="Every run this server knows")
async def list_runs(state: Annotated[ServerState, Depends(get_state)]) -> dict[str, Any]:
    runs = [_summary(*state.find_run(name)) for name, _ in state.run_names()]
    return {"runs": runs}


# exclude_unset: a plan without stages is described without them, exactly as RunPlan.to_dict() gives it.
@router.get(
    "/runs/{name}",
    response_model=RunDetail,
    response_model_exclude_unset=True,
    responses=_NAME_ERRORS,
    summary="One run's plan",
)
async def get_run(
    state: Annotated[ServerState, Depends(get_state)],
    name: PathName,
) -> dict[str, Any]:
    return _detail(*state.find_run(name))


@router.post(
    "/runs",
    response_model=RunDetail,
    response_model_exclude_unset=True,
    status_code=201,
    responses={**_CREATE_ERRORS, 200: {"model": RunDetail, "description": "The same run already existed."}},
    summary="Create a run over the current caches of a task or mixture (idempotent)",
)
async def create_run(
    state: Annotated[ServerState, Depends(get_state)], body: RunCreate, response: Response
) -> dict[str, Any]:
    try:
        schedule = _schedule(body.schedule)
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
            if configured.plan.to_dict() != run.plan.to_dict():
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


_STAGE_ERRORS = {
    **_AUTH,
    400: {"model": ErrorResponse, "description": "A stage that breaks a rule: in the past of the run (the "
          "message gives the earliest step allowed), rates that do not name every task, a batch size the "
          "data shards cannot split."},
    404: {"model": ErrorResponse, "description": "Unknown run."},
    409: {"model": ErrorResponse, "description": "The run is configured in the runs file, which the server "
          "does not write; or the stage starts in steps servers may have answered; or another writer changed "
          "the run first and the stage is no longer valid (the message names that change)."},
    503: {"model": ErrorResponse, "description": "Other writers kept changing the run's record: nothing stored; "
          "retry."},
}


@router.post(
    "/runs/{name}/stages",
    response_model=RunDetail,
    response_model_exclude_unset=True,
    status_code=201,
    responses={**_STAGE_ERRORS, 200: {"model": RunDetail, "description": "The run already ends with this stage."}},
    summary="Append a stage (other rates and/or batch schedule from a step on) to a stored run",
)
async def add_stage(
    state: Annotated[ServerState, Depends(get_state)],
    name: PathName,
    body: StageRequest,
    response: Response,
) -> dict[str, Any]:
    _, source = state.find_run(name)  # 404 for an unknown run
    if source == "config":
        raise HTTPException(
            409,
            f"Run {name!r} is configured in the server's runs file, which the server does not write: add the "
            "stage to its plan there and restart the servers.",
        )
    try:
        stage = Stage(
            start=body.start,
            # Stage parses and normalises the JSON rates itself (into Fractions), with its own messages.
            rates=cast("Mapping[str, Fraction] | None", body.rates),
            schedule=None if body.batch is None else _schedule(body.batch),
        )
    except PlanError as error:
        raise HTTPException(400, str(error)) from None

    def append() -> tuple[StoredRun, bool]:
        return state.store.add_stage(name, stage, current_step=body.current_step)

    try:
        run, added = await anyio.to_thread.run_sync(append)
    except RunError as error:
        status = 409 if isinstance(error, RunConflictError) else 400
        raise HTTPException(status, state.resolver.relative(str(error))) from None
    if not added:
        response.status_code = 200
    return _detail(run, "store")
