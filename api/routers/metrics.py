"""`GET /metrics`: Prometheus text format; per-topic gauges refreshed from the plan."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from api import queries
from api.auth import RequireViewer
from api.deps import RuntimeDep
from api.wire_http import ERROR_RESPONSES

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    dependencies=[RequireViewer],
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {}}},
        **{s: ERROR_RESPONSES[s] for s in (401, 403)},
    },
)
async def metrics(runtime: RuntimeDep) -> Response:
    """On the leader, recompute the per-topic gauges first (Kafka trouble only skips that)."""
    await queries.refresh_metrics(runtime)
    return Response(runtime.metrics.render(), media_type=CONTENT_TYPE_LATEST)
