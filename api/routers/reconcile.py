"""`GET /v1/reconcile/latest`: the newest reconcile run and its findings (viewer token).

Findings come from the `reconcile_findings` table, most urgent first; the run's Parquet
output (`run.out_dir`) has every finding when the table holds only the first ones.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec
from fastapi import APIRouter, Query, Response

from api.auth import RequireViewer
from api.deps import HistoryDep
from api.wire_http import ERROR_RESPONSES, answer, gives
from metasrv import wire
from metasrv.reconcile import latest_run

router = APIRouter(tags=["reconcile"], responses=ERROR_RESPONSES)


@router.get(
    "/v1/reconcile/latest",
    dependencies=[RequireViewer],
    summary="The newest reconcile run and its findings, most urgent first",
    response_class=Response,
    responses={
        200: gives(wire.ReconcileLatest, "The run and one page of its findings."),
        404: {"description": "No reconcile run has been recorded yet."},
    },
)
async def reconcile_latest(
    history: HistoryDep,
    kind: Annotated[wire.FindingKind | None, Query()] = None,
    severity: Annotated[wire.Severity | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> Response:
    """Read the run and a page of findings from the history database."""
    body = await asyncio.to_thread(
        latest_run,
        history,
        kind=None if kind is None else kind.value,
        severity=None if severity is None else severity.value,
        limit=limit,
        offset=offset,
    )
    return answer(msgspec.convert(body, wire.ReconcileLatest))
