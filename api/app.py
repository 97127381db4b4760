"""The FastAPI application: `create_app(settings)`.

The lifespan builds the whole runtime (`api.runtime.Runtime`), starts it, and
closes it on shutdown; routes reach it through api/deps.py. Errors map to statuses in
api/errors.py; bodies over `http.body_limit` get 413 from api/limits.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import heartbeat_fast_path
from api.auth import Authenticator
from api.errors import install_error_handlers
from api.limits import BodyLimitMiddleware
from api.routers import (
    dashboard,
    health,
    leader,
    metrics,
    procedures,
    purge,
    reconcile,
    regions,
    topics,
)
from api.runtime import Runtime
from api.wire_http import install_openapi
from metasrv.settings import Settings

API_VERSION = "1"


def create_app(settings: Settings, *, advertised_addr: str | None = None) -> FastAPI:
    """The app for one metasrv process. `advertised_addr` overrides the address other
    processes are told to use (default: `http.addr`)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime.build(settings, addr=advertised_addr)
        app.state.runtime = runtime
        try:
            await runtime.start()
            yield
        finally:
            await runtime.close()

    app = FastAPI(
        title="metasrv",
        summary="Control plane that purges a database's Kafka remote WAL",
        version=API_VERSION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.auth = Authenticator(settings.auth)
    install_error_handlers(app)
    # Added first, so it runs inside the body limit (the last added runs outermost).
    app.add_middleware(heartbeat_fast_path.HeartbeatFastPath)
    app.add_middleware(BodyLimitMiddleware, limit=settings.http.body_limit)
    routers = (
        regions,
        topics,
        purge,
        procedures,
        reconcile,
        health,
        leader,
        metrics,
        dashboard,
    )
    for module in routers:
        app.include_router(module.router)
    install_openapi(app, extra_paths={heartbeat_fast_path.PATH: heartbeat_fast_path.OPENAPI_PATH})
    return app
