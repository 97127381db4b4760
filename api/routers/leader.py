"""`GET /v1/leader`: who leads (answered by followers too)."""

from __future__ import annotations

from fastapi import APIRouter

from api.auth import RequireViewer
from api.deps import RuntimeDep
from api.models import ERROR_RESPONSES, LeaderOut

router = APIRouter(tags=["health"])


@router.get(
    "/v1/leader",
    dependencies=[RequireViewer],
    summary="Current leader address",
    responses={s: ERROR_RESPONSES[s] for s in (401, 403)},
)
async def leader(runtime: RuntimeDep) -> LeaderOut:
    """The leader's address as this process knows it."""
    election = runtime.election
    return LeaderOut(
        leader=election.leader_addr(),
        is_leader=election.is_leader,
        serving=runtime.serving,
        term=election.term,
        node=runtime.settings.node_name,
    )
