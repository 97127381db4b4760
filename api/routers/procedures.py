"""Procedure routes: list, inspect and cancel (DESIGN §5).

Reads are served by any replica (running procedures live in the kv backend, finished
ones in SQL history); cancelling needs the leader, which runs them.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from api import answers
from api.auth import RequireOperator, RequireViewer
from api.deps import LeaderDep, RuntimeDep
from api.runtime import Runtime
from api.wire_http import ERROR_RESPONSES, TopicQuery, answer, gives
from metasrv import wire
from metasrv.errors import Unavailable
from procedures import ProcedureManager
from procedures.wal_purge import PurgeServices

router = APIRouter(tags=["procedures"], responses=ERROR_RESPONSES)

ProcedureId = Annotated[
    str,
    Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="Procedure id"),
]


def manager_of(runtime: Runtime) -> ProcedureManager[PurgeServices]:
    """The runtime's procedure manager; 503 while it is not wired."""
    manager = runtime.procedures
    if not isinstance(manager, ProcedureManager):
        raise Unavailable("the procedure manager is not running on this metasrv")
    return manager


def _manager(runtime: RuntimeDep) -> ProcedureManager[PurgeServices]:
    return manager_of(runtime)


def _leader_manager(runtime: LeaderDep) -> ProcedureManager[PurgeServices]:
    return manager_of(runtime)


ManagerDep = Annotated[ProcedureManager[PurgeServices], Depends(_manager)]
"""The procedure manager (reads work on any replica)."""
LeaderManagerDep = Annotated[ProcedureManager[PurgeServices], Depends(_leader_manager)]
"""The procedure manager of the serving leader (421 on a follower, 503 while loading)."""


@router.get(
    "/v1/procedures",
    dependencies=[RequireViewer],
    summary="Procedures: unfinished and recent ones, newest first",
    response_class=Response,
    responses={200: gives(wire.ProcedureList, "Newest first.")},
)
async def list_procedures(
    manager: ManagerDep,
    state: Annotated[wire.ProcedureState | None, Query()] = None,
    topic: TopicQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    """Viewer token. Running ones from the kv backend, finished ones from SQL history."""
    views = await manager.list(state, topic=topic, limit=limit)
    return answer(wire.ProcedureList(procedures=[answers.procedure(v) for v in views]))


@router.get(
    "/v1/procedures/{procedure_id}",
    dependencies=[RequireViewer],
    summary="One procedure: state, step, attempts, error, timings",
    response_class=Response,
    responses={
        200: gives(wire.Procedure, "As the kv record (running) or SQL history (finished) has it."),
        404: {"description": "Unknown procedure id."},
    },
)
async def get_procedure(procedure_id: ProcedureId, manager: ManagerDep) -> Response:
    return answer(answers.procedure(await manager.get(procedure_id)))


@router.post(
    "/v1/procedures/{procedure_id}/cancel",
    dependencies=[RequireOperator],
    summary="Ask a procedure to stop at its next step boundary",
    response_class=Response,
    responses={
        200: gives(wire.Procedure, "The procedure after a short wait."),
        404: {"description": "Unknown procedure id."},
        409: {"description": "The procedure already finished."},
    },
)
async def cancel_procedure(procedure_id: ProcedureId, manager: LeaderManagerDep) -> Response:
    """Operator token. Returns the procedure after a short wait: `cancelled`, or still
    running if it had already recorded its deletion intent (a purge then runs to the end)."""
    return answer(answers.procedure(await manager.cancel(procedure_id)))
