"""`POST /v1/heartbeat`: the datanodes' only write (DESIGN §5).

`HeartbeatFastPath` serves the route as pure ASGI middleware, ahead of FastAPI's routing,
exception middleware and endpoint wrapping (a measurable share of this route's time at
hundreds of heartbeats a second); it applies the auth and leadership checks of every
route and renders errors with the app's own handlers (api/errors.py), and it sits inside
the body limit middleware, so 413s are unchanged. The body goes as bytes to
`metasrv.leader.HeartbeatHandler`, which decodes it with the `metasrv.wire` structs
that `OPENAPI_PATH` documents.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import BEARER_SECURITY, Access, authorize
from api.errors import render_error
from api.runtime import Runtime
from api.wire_http import ERROR_RESPONSES, JSON, gives
from metasrv import wire
from metasrv.errors import MetasrvError

PATH = "/v1/heartbeat"

OPENAPI_PATH: dict[str, Any] = {
    "post": {
        "tags": ["datanode"],
        "summary": "Report region and topic stats; receive instructions",
        "description": "Accept what is valid, list per-region rejections, return pending "
        "instructions. A malformed body, or one naming a region twice, is a 422 and "
        "changes nothing.",
        "operationId": "heartbeat",
        "requestBody": {
            "required": True,
            "content": {
                JSON: {"schema": wire.schema_ref(wire.Heartbeat)},
                "application/msgpack": {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": wire.COLUMNS_FORMAT,
                    }
                },
            },
        },
        "responses": {
            "200": gives(wire.HeartbeatResponse, "Rejections and pending instructions."),
            **{str(status): entry for status, entry in ERROR_RESPONSES.items()},
        },
        "security": BEARER_SECURITY,
    }
}
"""The route's OpenAPI entry (`HeartbeatFastPath` serves it; FastAPI's router never sees it)."""


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
        if scope["type"] != "http" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            if scope["method"] != "POST":
                raise StarletteHTTPException(405, "Method Not Allowed", headers={"Allow": "POST"})
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
