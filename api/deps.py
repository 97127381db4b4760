"""FastAPI dependencies: the runtime and its parts as `Annotated` aliases.

`RuntimeDep` is the wired `api.runtime.Runtime` the lifespan built. `LeaderDep` is
the same but answers 421 on a follower and 503 while a new leader loads its map: every
endpoint that reads or changes leader state takes it. `HistoryDep` is the SQL history
engine, readable on any process.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from api.runtime import Runtime


def get_runtime(request: Request) -> Runtime:
    """The runtime built by the lifespan."""
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_leader_runtime(request: Request) -> Runtime:
    """The runtime, if this process serves as leader (else 421 / 503)."""
    runtime: Runtime = request.app.state.runtime
    runtime.require_serving()
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
LeaderDep = Annotated[Runtime, Depends(get_leader_runtime)]


def _history(request: Request) -> Engine:
    return get_runtime(request).history


HistoryDep = Annotated[Engine, Depends(_history)]
