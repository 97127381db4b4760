"""`POST /v1/heartbeat`: the datanodes' only write (DESIGN §5).

The body is read as bytes and handed to `metasrv.heartbeat.HeartbeatHandler`, which
parses it once with orjson and validates it by hand: FastAPI's pydantic body parsing
would cost more than everything else on this path together. The pydantic models in
api/models.py only document the shape in OpenAPI.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api.auth import BEARER_SECURITY, Access, authorize
from api.models import ERROR_RESPONSES, HeartbeatRequest, HeartbeatResponse, inline_schema
from metasrv.runtime import Runtime

router = APIRouter(tags=["datanode"])


@router.post(
    "/v1/heartbeat",
    summary="Report region and topic stats; receive instructions",
    response_class=Response,
    responses={200: {"model": HeartbeatResponse}, **ERROR_RESPONSES},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline_schema(HeartbeatRequest)}},
        },
        "security": BEARER_SECURITY,
    },
)
async def heartbeat(request: Request) -> Response:
    """Accept what is valid, list per-region rejections, return pending instructions."""
    # Auth and leadership are checked inline rather than as dependencies: FastAPI's
    # dependency resolution costs a measurable share of this route's time.
    authorize(request, Access.DATANODE)
    runtime: Runtime = request.app.state.runtime
    runtime.require_serving()
    body = await request.body()
    return Response(runtime.heartbeats.handle(body), media_type="application/json")
