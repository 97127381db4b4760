"""`GET /v1/reconcile/latest`: the newest reconcile run and its findings (viewer token).

Findings come from the `reconcile_findings` table, most urgent first; the run's Parquet
output (`run.out_dir`) has every finding when the table holds only the first ones.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from api.auth import RequireViewer
from api.deps import HistoryDep
from api.models import ERROR_RESPONSES
from metasrv.reconcile import FindingKind, Severity, latest_run

router = APIRouter(tags=["reconcile"], responses=ERROR_RESPONSES)


class ReconcileFindingOut(BaseModel):
    """One finding of the run."""

    kind: FindingKind
    severity: Severity
    topic: str | None
    region_id: int | None
    message: str
    evidence: dict[str, Any] = Field(description="The observed values the finding rests on.")
    action: str | None = Field(description="What --apply did about it, if anything.")


class ReconcileRunOut(BaseModel):
    """The run itself."""

    run_id: str
    started_at: datetime
    finished_at: datetime
    status: str
    master: str
    applied: bool
    kv_revision: int | None
    counts: dict[str, dict[str, int]] = Field(description="kind -> severity -> findings")
    findings_total: int
    findings_stored: int = Field(description="Findings kept in SQL (the Parquet has all).")
    out_dir: str | None
    summary: dict[str, Any]


class ReconcileLatestOut(BaseModel):
    """The newest run with one page of its findings."""

    run: ReconcileRunOut
    findings: list[ReconcileFindingOut]
    matched: int = Field(description="Stored findings matching the filters.")
    limit: int
    offset: int


@router.get(
    "/v1/reconcile/latest",
    dependencies=[RequireViewer],
    summary="The newest reconcile run and its findings, most urgent first",
    responses={404: {"description": "No reconcile run has been recorded yet."}},
)
async def reconcile_latest(
    history: HistoryDep,
    kind: Annotated[FindingKind | None, Query()] = None,
    severity: Annotated[Severity | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> ReconcileLatestOut:
    """Read the run and a page of findings from the history database."""
    body = await asyncio.to_thread(
        latest_run,
        history,
        kind=None if kind is None else kind.value,
        severity=None if severity is None else severity.value,
        limit=limit,
        offset=offset,
    )
    return ReconcileLatestOut.model_validate(body)
