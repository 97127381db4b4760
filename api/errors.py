"""Error responses: every error is `{"error": {"code", "message", ...}}` (DESIGN §5).

Each base class of the `metasrv.errors` hierarchy maps to one HTTP status, registered
once with `add_exception_handler` (Starlette finds the handler along the MRO), so routes
never translate errors. Bad input is always a 4xx; a 500 means a bug and is logged.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from metasrv.errors import (
    Conflict,
    InvalidArgument,
    LeadershipLost,
    LockNotAcquired,
    MetasrvError,
    NotFound,
    NotLeader,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)

logger = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[MetasrvError], int] = {
    InvalidArgument: 422,
    NotFound: 404,
    Conflict: 409,
    Unauthenticated: 401,
    PermissionDenied: 403,
    NotLeader: 421,
    LeadershipLost: 421,
    Unavailable: 503,
    LockNotAcquired: 503,
    MetasrvError: 500,
}
"""HTTP status of each base error class; subclasses inherit their base's status."""

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
}


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The DESIGN §5 error object; `extra` fields sit next to code and message."""
    return {"error": {"code": code, "message": message, **extra}}


def error_response(
    status: int, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """A JSON error response in the DESIGN shape."""
    return JSONResponse(
        error_body(code, message, **jsonable_encoder(extra)), status_code=status, headers=headers
    )


def _headers_for(status: int) -> dict[str, str] | None:
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    if status == 503:
        return {"Retry-After": "1"}
    return None


async def _metasrv_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, MetasrvError)
    status = next(s for cls, s in STATUS_BY_ERROR.items() if isinstance(exc, cls))
    if status >= 500 and status != 503:
        logger.error(
            "request failed",
            exc_info=exc,
            extra={"path": request.url.path, "code": exc.code},
        )
    return error_response(
        status, exc.code, exc.message, headers=_headers_for(status), **exc.details
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "loc": list(e.get("loc", ())),
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in exc.errors()
    ]
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    message = f"{where}: {first['msg']}" if where else str(first["msg"])
    return error_response(422, "validation_error", message, errors=errors)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    return error_response(exc.status_code, code, str(exc.detail), headers=headers or None)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Only true bugs get here: every expected failure is a MetasrvError.
    logger.error("unhandled error", exc_info=exc, extra={"path": request.url.path})
    return error_response(500, "internal", "internal error")


async def render_error(
    request: Request, exc: MetasrvError | StarletteHTTPException
) -> JSONResponse:
    """The response the app's handler gives `exc`, for ASGI code that runs outside the
    routes (the heartbeat fast path)."""
    if isinstance(exc, MetasrvError):
        return await _metasrv_error(request, exc)
    return await _http_error(request, exc)


def install_error_handlers(app: FastAPI) -> None:
    """Register one handler per base class, plus request validation and HTTP errors."""
    for cls in STATUS_BY_ERROR:
        app.add_exception_handler(cls, _metasrv_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
