"""`/healthz` (the process answers) and `/readyz` (kv and Kafka reachable, history migrated, no
background task dead). No token, so failures name the store or task, never an address or user."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api import queries
from api.deps import RuntimeDep
from api.errors import error_response
from api.models import ErrorBody, HealthOut, ReadyOut

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process is up")
async def healthz() -> HealthOut:
    """Always ok while the event loop runs."""
    return HealthOut(status="ok")


@router.get(
    "/readyz",
    summary="Readiness: kv and Kafka answer, the history schema is current, no task died",
    response_model=ReadyOut,
    responses={
        503: {"model": ErrorBody, "description": "A dependency is unreachable or unmigrated."}
    },
)
async def readyz(runtime: RuntimeDep) -> Any:
    """200 when kv and Kafka answer, the history database has the newest schema and every
    background task runs; 503 with the failing checks (and why) otherwise."""
    checks = await queries.readiness(runtime)
    leader = runtime.election.is_leader
    if all(v == "ok" for v in checks.values()):
        return ReadyOut(status="ready", checks=checks, is_leader=leader)
    failing = ", ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok")
    return error_response(
        503, "not_ready", f"not ready ({failing})", headers={"Retry-After": "1"}, checks=checks
    )
