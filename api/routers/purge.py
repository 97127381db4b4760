"""Purge routes: trigger (or dry-run) purges, read purge history and WAL events (DESIGN §5).

`POST /v1/purge` submits one WAL purge procedure per topic and answers 202 with their
ids; with `dry_run` it answers 200 with the plan those purges would follow now. History
and events come from SQL, so any replica serves them; the leader first writes the events
it still holds in memory (`EventLog.read`), so they include those of every purge it has
seen end.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BeforeValidator

from api import answers, queries
from api.auth import RequireOperator, RequireViewer
from api.deps import LeaderDep, RuntimeDep
from api.routers.procedures import manager_of
from api.wire_http import ERROR_RESPONSES, TopicQuery, answer, body_of, gives, takes
from metasrv import wire
from procedures import History
from procedures.wal_purge import submit_purges

router = APIRouter(tags=["purge"], responses=ERROR_RESPONSES)

EventKinds = Annotated[
    list[wire.EventKind] | None,
    Query(description="Only events of this kind; repeat it for several kinds."),
]


def _rfc3339(value: object) -> object:
    if not isinstance(value, str):
        return value
    if len(value) > 64:
        raise ValueError("longer than 64 characters")
    return wire.parse_rfc3339(value)


Since = Annotated[
    datetime | None,
    BeforeValidator(_rfc3339),
    Query(
        description="Only events at or after this time: RFC 3339 with its offset, e.g. "
        f"`{wire.RFC3339_EXAMPLE}` (a `+` offset is written `%2B` in a URL).",
    ),
]


@router.post(
    "/v1/purge",
    dependencies=[RequireOperator],
    status_code=202,
    summary="Purge the WAL of some or all topics (or show the plan with dry_run)",
    response_class=Response,
    responses={
        202: gives(wire.PurgeSubmitted, "Procedures submitted (one per topic)."),
        200: gives(wire.PlanList, "dry_run: the plan; nothing submitted."),
        404: {"description": "A named topic is unknown; nothing was submitted."},
    },
    openapi_extra=takes(wire.PurgeRequest),
)
async def purge(
    runtime: LeaderDep, body: Annotated[wire.PurgeRequest, Depends(body_of(wire.PurgeRequest))]
) -> Response:
    """Operator token. A topic that already has a purge running yields that procedure's
    id again; an unknown topic fails the whole request (404) before anything is submitted."""
    topics = None if body.topics is None else list(dict.fromkeys(body.topics))
    if body.dry_run:
        plans = await queries.compute_plans(runtime, topics)
        return answer(wire.PlanList(topics=[answers.plan(p) for p in plans.values()]))
    ids = await submit_purges(manager_of(runtime), topics, reason="manual")
    return answer(wire.PurgeSubmitted(procedure_ids=ids), 202)


@router.get(
    "/v1/purge/history",
    dependencies=[RequireViewer],
    summary="Completed purges, newest first (from SQL)",
    response_class=Response,
    responses={200: gives(wire.PurgeHistory, "Newest first.")},
)
async def purge_history(
    runtime: RuntimeDep,
    topic: TopicQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> Response:
    """Viewer token. What each purge deleted, from which marker to which, how long it took."""
    rows = await History(runtime.history).purges(topic=topic, limit=limit)
    return answer(wire.PurgeHistory(purges=rows))


@router.get(
    "/v1/events",
    dependencies=[RequireViewer],
    summary="WAL events: every prune attempt and WAL data loss, newest first (from SQL)",
    response_class=Response,
    responses={200: gives(wire.WalEventList, "Newest first.")},
)
async def wal_events(
    runtime: RuntimeDep,
    topic: TopicQuery = None,
    kind: EventKinds = None,
    since: Since = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> Response:
    """Viewer token. Each purge's start, retried errors and end (deleted, skipped and
    why, failed, cancelled) and WAL data loss (invariant 7), kept for
    `history.events_retention`."""
    rows = await runtime.purge.events.read(topic=topic, kinds=kind or (), since=since, limit=limit)
    return answer(wire.WalEventList(events=rows))
