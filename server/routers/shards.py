"""``GET /shards``: what one host reads at steps ``step .. step + steps - 1`` of a run.

Hosts and data shards: the run plan fixes ``num_data_shards`` (D), which alone decides how each global
batch is split, so the global batch never depends on the number of hosts. ``num_hosts`` (H, default D)
must be a multiple or a divisor of D (``taskdata.index.host_slice_for``). A multiple: host ``h`` reads
data shard ``h // (H / D)``, so consecutive hosts that hold one model replica read the same slice. A
divisor (fewer hosts, e.g. a run resumed on a smaller slice): host ``h`` reads data shards ``h * D / H``
to ``(h + 1) * D / H - 1`` as one slice, computed as such (not glued from data shards).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import anyio.to_thread
from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from server.assignments import shards_body, step_json
from server.models import MAX_STEP, ErrorResponse, ShardsQuery, ShardsResponse
from server.state import ServerState, first_use, get_state
from taskdata.index import PlanError, ReadsError, host_slice_for
from taskdata.index.columns import ColumnEncoding
from taskdata.runs import ResolvedCache, StoredRun

__all__ = ["router"]

router = APIRouter(tags=["shards"])

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
        "(first use; with Retry-After); or other writers kept changing the run's record while this server "
        "reserved the steps asked for.",
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
    "/shards",
    response_model=ShardsResponse,
    responses={**_ERRORS, 422: _INVALID_PARAMETERS},
    summary="Read instructions of one host for a window of steps",
    openapi_extra={"parameters": _query_parameters()},
)
async def get_shards(request: Request) -> Response:
    # The parameters are read here with ShardsQuery rather than declared one by one: FastAPI's per-request
    # work for six declared parameters and two dependencies was ~80 us, as much as computing an answer.
    # The schema documents them from the same model (openapi_extra above).
    try:
        query = ShardsQuery.model_validate(dict(request.query_params))
    except ValidationError as error:
        raise RequestValidationError(
            [{**e, "loc": ("query", *e["loc"])} for e in error.errors(include_url=False)]
        ) from None
    body = await _answer(await get_state(request), **query.model_dump())
    return Response(body, media_type="application/json")


async def _answer(state: ServerState, **query: Any) -> bytes:
    """The body of ``GET /shards`` for the fields of a ``ShardsQuery`` (``host``, ``step``, ``steps``, ``run``,
    ``num_hosts``, ``encoding``) that it validated; HTTPException (400, 404, 503) or the errors of the run's
    caches (``server.main``'s exception handlers answer them) otherwise."""
    asked = _asked(state, **query)
    if asked.unreserved:
        stored = await anyio.to_thread.run_sync(state.store.reserve, asked.stored.name, _reserve_to(state, asked))
        asked = asked._replace(stored=stored, unreserved=False)
    caches = state.resolver.cached(asked.stored) or await first_use(state, asked.stored)
    steps_to_do = _StepsToDo(state, asked, caches)
    if steps_to_do.index_math() > 1:
        # Several steps of index math: a worker thread keeps the event loop answering other requests. (Steps
        # kept whole need only their JSON: a thread's round trip cost more than that, ~150 us a request.)
        await anyio.to_thread.run_sync(steps_to_do.compute)
    else:
        steps_to_do.compute()
    # A trainer's lookahead window: its next one is computed ahead (one step alone is as quick to compute on
    # demand as to hand to a thread).
    following = range(asked.step + asked.steps, asked.step + 2 * asked.steps)
    if asked.steps > 1 and following[-1] <= MAX_STEP:
        state.answers.ahead(asked.stored.name, steps_to_do.tables, following, asked.slice_count, asked.encoding)
    return steps_to_do.body()


class _Asked(NamedTuple):
    """One ``/shards`` request, checked against its run."""

    stored: StoredRun
    host: int
    hosts: int
    slice_index: int  # the host's slice of the global batch: slice_index of slice_count
    slice_count: int
    data_shard: int  # the first data shard of the host's slice
    step: int
    steps: int
    encoding: ColumnEncoding
    # A stored run's steps at or after its served_before: the server must raise that before answering them.
    unreserved: bool


def _reserve_to(state: ServerState, asked: _Asked) -> int:
    return asked.step + asked.steps + state.settings.run_reserve_steps


def _asked(
    state: ServerState,
    *,
    host: int,
    step: int,
    steps: int,
    run: str | None,
    num_hosts: int | None,
    encoding: ColumnEncoding,
) -> _Asked:
    stored, source = state.find_run(run)
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
    data_shard = index * (plan.num_data_shards // count)
    # A run of the runs file never changes; a stored one may gain stages from its served_before on.
    unreserved = source == "store" and step + steps > stored.served_before
    return _Asked(stored, host, hosts, index, count, data_shard, step, steps, encoding, unreserved)


class _StepsToDo:
    """The steps of one answer: those in the answer cache, and those whose index math is still to do."""

    def __init__(self, state: ServerState, asked: _Asked, caches: tuple[ResolvedCache, ...]):
        stored, step, encoding = asked.stored, asked.step, asked.encoding
        self.asked = asked
        self.cache = cache = state.answers
        self.tables = cache.tables(stored, caches)
        if encoding == "compact":
            for files in self.tables.files:  # each cache's pattern is found once and kept (CacheFiles.names_json)
                try:
                    files.names_json  # noqa: B018
                except ReadsError as error:
                    raise HTTPException(400, f"Run {stored.name!r}: {error}") from None
        # A stored run may gain stages: the plan's fingerprint keeps answers of the plan before from being
        # served after.
        fingerprint = stored.plan.fingerprint()
        self.keys = [
            (stored.name, fingerprint, asked.slice_count, asked.slice_index, s, encoding)
            for s in range(step, step + asked.steps)
        ]
        self.parts: list[bytes | None] = [cache.get(key) for key in self.keys]
        self.missing = [i for i, part in enumerate(self.parts) if part is None]

    def index_math(self) -> int:
        """How many of the missing steps need their index math (the others are kept whole: only JSON to write)."""
        if len(self.missing) < 2:
            return len(self.missing)
        asked, cache = self.asked, self.cache
        return sum(not cache.kept(asked.stored.name, self.tables, asked.step + i, asked.slice_count) for i in self.missing)

    def compute(self) -> None:
        """The index math (where not done) and JSON of the missing steps, each kept in the answer cache."""
        asked, cache = self.asked, self.cache
        for i in self.missing:
            part = step_json(cache, asked.stored.name, self.tables, asked.step + i, asked.slice_index,
                             asked.slice_count, asked.encoding)  # fmt: skip
            self.parts[i] = part
            cache.put(self.keys[i], part)
        self.missing = []

    def body(self) -> bytes:
        """The answer (``shards_body``)."""
        asked = self.asked
        assert not self.missing, "compute() first"
        last = asked.step + asked.steps - 1
        return shards_body(asked.stored, asked.host, asked.hosts, asked.data_shard, last, self.parts)  # type: ignore[arg-type]
