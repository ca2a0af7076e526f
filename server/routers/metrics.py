"""``GET /metrics``: request counts, errors, latency histograms and the step cache, for Prometheus.

Written by ``prometheus_client`` from the app's own registry: the Prometheus text format 0.0.4, or
OpenMetrics when the scraper's Accept header asks for it (as Prometheus does).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import PlainTextResponse

from server.metrics import StepCacheCollector
from server.state import ServerState, get_state

__all__ = ["router"]

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    summary="Prometheus metrics",
    responses={
        200: {
            "content": {
                "text/plain": {"schema": {"type": "string"}},
                "application/openmetrics-text": {"schema": {"type": "string"}},
            }
        },
        401: {
            "description": "Missing or invalid bearer token.",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
        },
    },
)
async def metrics(request: Request, state: Annotated[ServerState, Depends(get_state)]) -> Response:
    body, content_type = request.app.state.metrics.exposition(
        request.headers.get("accept"), StepCacheCollector(state.answers)
    )
    return Response(body, media_type=content_type)
