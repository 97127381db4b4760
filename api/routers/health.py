"""`/healthz` (the process answers) and `/readyz` (kv and Kafka reachable, history migrated, no
background task dead; on a follower, its topic-region map loaded and following the kv). No token,
so failures name the store or task, never an address or user."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api import queries
from api.deps import RuntimeDep
from api.errors import error_response
from api.runtime import Runtime
from api.wire_http import answer, gives
from metasrv import wire

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    summary="Liveness: the process is up",
    response_class=Response,
    responses={200: gives(wire.Health, "Always ok while the event loop runs.")},
)
async def healthz() -> Response:
    return answer(wire.Health(status="ok"))


@router.get(
    "/readyz",
    summary="Readiness: kv and Kafka answer, the history schema is current, no task died, "
    "a follower's map is warm",
    response_class=Response,
    responses={
        200: gives(wire.Ready, "Every check is ok."),
        503: gives(
            wire.ErrorBody,
            "A dependency is unreachable or unmigrated, or (a follower) its topic-region map "
            "is still loading: `follower_map` says how many routes it has read.",
        ),
    },
)
async def readyz(runtime: RuntimeDep) -> Response:
    """200 when kv and Kafka answer, the history database has the newest schema, every
    background task runs and, on a follower, its map is loaded and followed (a take-over
    then costs a catch-up, not a full load); 503 with the failing checks (and why) otherwise."""
    checks = await queries.readiness(runtime)
    leader = runtime.election.is_leader
    follower_map = follower_map_check(runtime, leader)
    if follower_map is not None:
        checks["follower_map"] = follower_map
    if all(v == "ok" for v in checks.values()):
        return answer(wire.Ready(status="ready", checks=checks, is_leader=leader))
    failing = ", ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok")
    return error_response(
        503, "not_ready", f"not ready ({failing})", headers={"Retry-After": "1"}, checks=checks
    )


def follower_map_check(runtime: Runtime, is_leader: bool) -> str | None:
    """A follower's `follower_map` check: "ok" once its topic-region map is loaded and
    follows the kv, else how far its full load is. None on the leader (its readiness does
    not depend on it) and where no process follows (the single-process SQLite kv)."""
    follower = runtime.follower
    if follower is None or is_leader:
        return None
    if follower.warm:
        return "ok"
    task = follower.task
    if task is None or task.done():
        return "not following the kv"
    # Until the watch is open too: a load's count stays at its total meanwhile.
    return f"loading: {follower.routes_read} routes read"
