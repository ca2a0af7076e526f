"""``/tasks``: registered tasks and mixtures, their definitions and their cache versions on disk."""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Depends

from server.catalog import task_detail, task_summaries
from server.models import ErrorResponse, PathName, TaskDetail, TaskList
from server.state import ServerState, get_state

__all__ = ["router"]

router = APIRouter(tags=["tasks"])

# FastAPI's type of a route's extra OpenAPI responses (free-form JSON objects).
_AUTH: dict[int | str, dict[str, Any]] = {401: {"model": ErrorResponse, "description": "Missing or invalid bearer token."}}


@router.get("/tasks", response_model=TaskList, responses=_AUTH, summary="Registered tasks and mixtures")
async def list_tasks(state: Annotated[ServerState, Depends(get_state)]) -> dict[str, Any]:
    # Fingerprints list source files, and the built-in tasks' first one trains their vocabulary: off the
    # event loop, or every other request (and /healthz) waits for it.
    return {"tasks": await anyio.to_thread.run_sync(task_summaries, state.registry)}


@router.get(
    "/tasks/{name}",
    response_model=TaskDetail,
    responses={
        **_AUTH,
        400: {"model": ErrorResponse, "description": "Invalid name."},
        404: {"model": ErrorResponse, "description": "Unknown task or mixture (close matches are listed)."},
    },
    summary="A task's or mixture's definition, fingerprint and cache versions",
)
async def get_task(
    state: Annotated[ServerState, Depends(get_state)],
    name: PathName,
) -> dict[str, Any]:
    # Listing versions reads manifests and stats files: file I/O, off the event loop.
    return await anyio.to_thread.run_sync(task_detail, state.registry, state.resolver, name)
