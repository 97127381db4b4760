"""`GET /v1/leader`: who leads (answered by followers too)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api.auth import RequireViewer
from api.deps import RuntimeDep
from api.wire_http import ERROR_RESPONSES, answer, gives
from metasrv import wire

router = APIRouter(tags=["health"])


@router.get(
    "/v1/leader",
    dependencies=[RequireViewer],
    summary="Current leader address",
    response_class=Response,
    responses={
        200: gives(wire.Leader, "The leader's address as this process knows it."),
        **{s: ERROR_RESPONSES[s] for s in (401, 403)},
    },
)
async def leader(runtime: RuntimeDep) -> Response:
    election = runtime.election
    return answer(
        wire.Leader(
            leader=election.leader_addr(),
            is_leader=election.is_leader,
            serving=runtime.serving,
            term=election.term,
            node=runtime.settings.node_name,
        )
    )
