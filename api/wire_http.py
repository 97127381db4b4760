"""Speaking `metasrv.wire` over FastAPI: decode a request body, answer with a struct, and
document both in the OpenAPI document.

FastAPI documents pydantic models by itself; the wire is msgspec structs, so routes say
what they take and give with `takes(...)` and `gives(...)`, and `install_openapi` adds
the structs' schemas (from msgspec) to the document.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Path, Query, Request, Response
from fastapi.openapi.utils import get_openapi

from metasrv import wire

T = TypeVar("T")

JSON = "application/json"

_TOPIC = {"min_length": 1, "max_length": wire.TOPIC_MAX_LENGTH, "pattern": wire.TOPIC_PATTERN}
TopicQuery = Annotated[str | None, Query(description="Only this topic.", **_TOPIC)]
TopicPath = Annotated[str, Path(description="Topic name.", **_TOPIC)]


def answer(body: Any, status: int = 200) -> Response:
    """A wire struct as the JSON response."""
    return Response(wire.encode(body), status_code=status, media_type=JSON)


def body_of(kind: type[T]) -> Callable[[Request], Awaitable[T]]:
    """A dependency giving the request body decoded as `kind` (422 naming the bad field)."""

    async def decode(request: Request) -> T:
        return wire.decode(await request.body(), kind)

    return decode


def gives(kind: type[Any], description: str) -> dict[str, Any]:
    """An OpenAPI response entry whose JSON body is `kind`."""
    return {"description": description, "content": {JSON: {"schema": wire.schema_ref(kind)}}}


def takes(kind: type[Any]) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON request body is `kind`."""
    return {"requestBody": {"required": True, "content": {JSON: {"schema": wire.schema_ref(kind)}}}}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: gives(wire.ErrorBody, text)
    for status, text in (
        (400, "Request body is not decodable (e.g. not UTF-8)."),
        (401, "Missing or unknown bearer token."),
        (403, "The token's role may not call this endpoint."),
        (413, "Request body over `http.body_limit`."),
        (414, "Request target over `http.url_limit`."),
        (421, "This metasrv is a follower; `leader` names it."),
        (422, "Request does not match the schema."),
        (503, "New leader still loading, or a dependency is down."),
    )
}
"""Error statuses every leader endpoint may answer."""


def install_openapi(app: FastAPI, *, extra_paths: dict[str, dict[str, Any]]) -> None:
    """Build the document once, with every wire struct under `components.schemas` and
    `extra_paths` (routes served outside FastAPI's router) among the paths."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            document["paths"].update(extra_paths)
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(wire.schema_components([*wire.ANSWERS, *wire.REQUESTS, *wire.HEARTBEAT]))
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
