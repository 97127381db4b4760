"""`POST /v1/heartbeat`: the datanodes' only write (DESIGN §5).

The body is read as bytes and handed to `metasrv.heartbeat.HeartbeatHandler`, which
parses it once with orjson and validates it by hand: FastAPI's pydantic body parsing
would cost more than everything else on this path together. The pydantic models in
api/models.py only document the shape in OpenAPI.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api.auth import RequireDatanode
from api.deps import LeaderDep
from api.models import ERROR_RESPONSES, HeartbeatRequest, HeartbeatResponse, inline_schema

router = APIRouter(tags=["datanode"])


@router.post(
    "/v1/heartbeat",
    dependencies=[RequireDatanode],
    summary="Report region and topic stats; receive instructions",
    response_class=Response,
    responses={200: {"model": HeartbeatResponse}, **ERROR_RESPONSES},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline_schema(HeartbeatRequest)}},
        }
    },
)
async def heartbeat(request: Request, runtime: LeaderDep) -> Response:
    """Accept what is valid, list per-region rejections, return pending instructions."""
    body = await request.body()
    return Response(runtime.heartbeats.handle(body), media_type="application/json")
