"""Request body limit (`http.body_limit`): 413 before the body is read when the declared
length is too large, and as soon as a chunked body passes the limit. A client that goes
away before its body has arrived (or is cut off by `http.read_timeout`, api/serving.py)
ends its request quietly: there is nobody left to answer."""

from __future__ import annotations

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class PayloadTooLarge(HTTPException):
    """Raised from `receive` when the body passes the limit; rendered by api/errors.py."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


def _too_large_body(limit: int) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "code": "payload_too_large",
                "message": f"request body larger than {limit} bytes",
            }
        }
    )


class BodyLimitMiddleware:
    """Pure ASGI middleware (no per-request allocation beyond a closure)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    break
                if declared > limit:
                    await self._reject(send)
                    return
                break

        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except ClientDisconnect:
            return
        except PayloadTooLarge:
            # Normally the app's handler renders it; this covers a read outside a route.
            if started:
                raise
            await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = _too_large_body(self.limit)
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    # The unread body makes the connection unusable for another request.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
