"""`/healthz` (the process answers) and `/readyz` (kv and Kafka reachable, history migrated, no
background task dead). No token, so failures name the store or task, never an address or user."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api import queries
from api.deps import RuntimeDep
from api.errors import error_response
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
    summary="Readiness: kv and Kafka answer, the history schema is current, no task died",
    response_class=Response,
    responses={
        200: gives(wire.Ready, "Every check is ok."),
        503: gives(wire.ErrorBody, "A dependency is unreachable or unmigrated."),
    },
)
async def readyz(runtime: RuntimeDep) -> Response:
    """200 when kv and Kafka answer, the history database has the newest schema and every
    background task runs; 503 with the failing checks (and why) otherwise."""
    checks = await queries.readiness(runtime)
    leader = runtime.election.is_leader
    if all(v == "ok" for v in checks.values()):
        return answer(wire.Ready(status="ready", checks=checks, is_leader=leader))
    failing = ", ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok")
    return error_response(
        503, "not_ready", f"not ready ({failing})", headers={"Retry-After": "1"}, checks=checks
    )
