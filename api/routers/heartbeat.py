"""`POST /v1/heartbeat`: the datanodes' only write (DESIGN §5).

The body is read as bytes and handed to `metasrv.heartbeat.HeartbeatHandler`, which
decodes and validates it itself: FastAPI's pydantic body parsing would cost more than
everything else on this path together. The pydantic models in api/models.py only
document the shape in OpenAPI.

`HeartbeatFastPath` serves the route as pure ASGI middleware, ahead of FastAPI's routing,
exception middleware and endpoint wrapping (a measurable share of this route's time at
hundreds of heartbeats a second); it applies the same auth and leadership checks and
renders errors with the app's own handlers (api/errors.py), and it sits inside the body
limit middleware, so 413s are unchanged. The FastAPI route below documents the endpoint
in OpenAPI and serves it when the middleware is not installed.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import BEARER_SECURITY, Access, authorize
from api.errors import render_error
from api.models import ERROR_RESPONSES, HeartbeatRequest, HeartbeatResponse, inline_schema
from api.runtime import Runtime
from metasrv.errors import MetasrvError
from metasrv.heartbeat_wire import COLUMNS_FORMAT

router = APIRouter(tags=["datanode"])

PATH = "/v1/heartbeat"


@router.post(
    PATH,
    summary="Report region and topic stats; receive instructions",
    response_class=Response,
    responses={200: {"model": HeartbeatResponse}, **ERROR_RESPONSES},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": inline_schema(HeartbeatRequest)},
                "application/msgpack": {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": COLUMNS_FORMAT,
                    }
                },
            },
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
    return Response(handle(runtime, request, body), media_type="application/json")


MSGPACK_TYPES = frozenset(
    {"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}
)


def handle(runtime: Runtime, request: Request, body: bytes) -> bytes:
    """The handler for the body's encoding: JSON (DESIGN §5), or msgpack columns."""
    content_type = request.headers.get("content-type", "")
    if content_type.partition(";")[0].strip().lower() in MSGPACK_TYPES:
        return runtime.heartbeats.handle_columns(body)
    return runtime.heartbeats.handle(body)


_JSON_HEADERS = [(b"content-type", b"application/json")]


class HeartbeatFastPath:
    """ASGI middleware: `POST /v1/heartbeat` without FastAPI's per-request machinery."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            authorize(request, Access.DATANODE)
            runtime: Runtime = request.app.state.runtime
            runtime.require_serving()
            body = await request.body()
            content = handle(runtime, request, body)
        except (MetasrvError, StarletteHTTPException) as exc:
            # Anything else is a bug: it propagates to Starlette's ServerErrorMiddleware,
            # which renders the app's 500 handler as for any route.
            response = await render_error(request, exc)
            await response(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*_JSON_HEADERS, (b"content-length", str(len(content)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": content})
