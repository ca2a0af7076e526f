"""``GET /shards``: what one host reads at steps ``step .. step + steps - 1`` of a run.

Hosts and data shards: the run plan fixes ``num_data_shards`` (D), which alone decides how each global
batch is split, so the global batch never depends on the number of hosts. ``num_hosts`` (H, default D)
must be a multiple or a divisor of D (``taskdata.index.host_slice_for``). A multiple: host ``h`` reads
data shard ``h // (H / D)``, so consecutive hosts that hold one model replica read the same slice. A
divisor (fewer hosts, e.g. a run resumed on a smaller slice): host ``h`` reads data shards ``h * D / H``
to ``(h + 1) * D / H - 1`` as one slice, computed as such (not glued from data shards).
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from server.assignments import AnswerCache, shards_body, step_json
from server.models import MAX_STEP, ErrorResponse, ShardsQuery, ShardsResponse
from server.state import ServerState, first_use, get_state
from taskdata.index import PlanError, ReadsError, RunTables, host_slice_for
from taskdata.index.columns import ColumnEncoding

__all__ = ["PATH", "answer", "router"]

router = APIRouter(tags=["shards"])
PATH = "/shards"

# FastAPI's type of a route's extra OpenAPI responses (free-form JSON objects).
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorResponse,
        "description": "A parameter outside what the run allows (the message says which).",
    },
    401: {"model": ErrorResponse, "description": "Missing or invalid bearer token."},
    404: {"model": ErrorResponse, "description": "Unknown run."},
    503: {
        "model": ErrorResponse,
        "description": "A cache of the run is missing, incomplete, fails verification, or is being verified "
        "(first use; with Retry-After).",
    },
}


# FastAPI documents 422 itself only for parameters it parses; the schema it refers to is FastAPI's own
# (present because other routes declare parameters; the schema test resolves every reference).
_INVALID_PARAMETERS = {
    "description": "A parameter of the wrong type, out of its bounds, or unknown (the errors say which).",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}},
}


def _query_parameters() -> list[dict]:
    """The OpenAPI parameters of ``/shards``, from ``ShardsQuery`` (the handler validates with that model)."""
    schema = ShardsQuery.model_json_schema()
    parameters = []
    for name, spec in schema["properties"].items():
        parameter = {
            "name": name,
            "in": "query",
            "required": name in schema.get("required", ()),
            "schema": spec,
        }
        if "description" in spec:
            parameter["description"] = spec["description"]
        parameters.append(parameter)
    return parameters


@router.get(
    PATH,
    response_model=ShardsResponse,
    responses={**_ERRORS, 422: _INVALID_PARAMETERS},
    summary="Read instructions of one host for a window of steps",
    openapi_extra={"parameters": _query_parameters()},
)
async def get_shards(request: Request) -> Response:
    # The parameters are read here with ShardsQuery rather than declared one by one: FastAPI's per-request
    # work for six declared parameters and two dependencies was ~80 us, as much as computing an answer.
    # The schema documents them from the same model (openapi_extra above). Plainly valid requests do not
    # come here: server.shards_fast answers them before FastAPI's routing, with the same answer().
    try:
        query = ShardsQuery.model_validate(dict(request.query_params))
    except ValidationError as error:
        raise RequestValidationError(
            [{**e, "loc": ("query", *e["loc"])} for e in error.errors(include_url=False)]
        ) from None
    body = await answer(await get_state(request), **query.model_dump())
    return Response(body, media_type="application/json")


async def answer(
    state: ServerState,
    *,
    host: int,
    step: int,
    steps: int,
    run: str | None,
    num_hosts: int | None,
    encoding: ColumnEncoding,
) -> bytes:
    """The body of ``GET /shards`` for parameters that ``ShardsQuery`` validated; HTTPException (400, 404,
    503) or the errors of the run's caches (``server.main``'s exception handlers answer them) otherwise."""
    stored, _ = state.find_run(run)
    plan = stored.plan
    hosts = plan.num_data_shards if num_hosts is None else num_hosts
    if host >= hosts:
        raise HTTPException(
            400,
            f"Host {host} is outside [0, {hosts}): run {stored.name!r} is read by {hosts} hosts"
            f"{'' if num_hosts is not None else ' (its num_data_shards; pass num_hosts if there are more)'}.",
        )
    if step + steps - 1 > MAX_STEP:
        raise HTTPException(
            400,
            f"Steps {step}..{step + steps - 1} go beyond the last step this server answers ({MAX_STEP} = "
            f"2**53 - 1, the largest integer every JSON reader holds exactly). Ask for fewer steps.",
        )
    try:
        index, count = host_slice_for(host, hosts, plan.num_data_shards)
    except PlanError as error:
        raise HTTPException(400, f"Run {stored.name!r}: {error}") from None
    data_shard = index * (plan.num_data_shards // count)  # the first data shard of the host's slice
    caches = state.resolver.cached(stored) or await first_use(state, stored)
    cache = state.answers
    tables = cache.tables(stored, caches)
    if encoding == "compact":
        for files in tables.files:  # each cache's pattern is found once and kept (CacheFiles.names_json)
            try:
                files.names_json  # noqa: B018
            except ReadsError as error:
                raise HTTPException(400, f"Run {stored.name!r}: {error}") from None
    # A stored run may gain stages: the plan's fingerprint keeps answers of the plan before from being served after.
    keys = [(stored.name, plan.fingerprint(), count, index, s, encoding) for s in range(step, step + steps)]
    parts: list[bytes | None] = [cache.get(key) for key in keys]
    missing = [i for i, part in enumerate(parts) if part is None]
    work = (cache, stored.name, tables, [step + i for i in missing], index, count, encoding)
    if len(missing) > 1:
        # Several steps of index math: a worker thread keeps the event loop answering other requests.
        computed = await anyio.to_thread.run_sync(_compute, *work)
    else:
        computed = _compute(*work)
    for i, part in zip(missing, computed, strict=True):
        parts[i] = part
        cache.put(keys[i], part)
    # Every missing part was filled in above, so parts holds no None now.
    return shards_body(stored, host, hosts, data_shard, step + steps - 1, parts)  # type: ignore[arg-type]


def _compute(
    memory: AnswerCache,
    run: str,
    tables: RunTables,
    steps: list[int],
    index: int,
    count: int,
    encoding: ColumnEncoding,
) -> list[bytes]:
    return [step_json(memory, run, tables, s, index, count, encoding) for s in steps]
