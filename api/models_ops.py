"""Request and response models of the operator endpoints: purge, procedures, history, events.

Strict on input (unknown fields are rejected, topic names validated) and explicit on
output, so the OpenAPI document tells clients exactly what they get.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from api.models import TopicName
from procedures import ProcedureView
from procedures import PurgeRecord as PurgeRow
from procedures import WalEvent as WalEventRow

ProcedureStateName = Literal[
    "pending", "running", "retrying", "succeeded", "skipped", "failed", "cancelled"
]

MAX_PURGE_TOPICS = 10_000
"""Most topics one purge request may name."""


def _at(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PurgeRequest(BaseModel):
    """Body of `POST /v1/purge`."""

    model_config = ConfigDict(extra="forbid")

    topics: list[TopicName] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PURGE_TOPICS,
        description="Topics to purge (deduplicated); null purges every topic with regions.",
    )
    dry_run: StrictBool = Field(
        default=False, description="Return the plan; submit nothing (JSON true or false only)."
    )


class PurgeSubmitted(_Out):
    """`POST /v1/purge` answer: one procedure per topic."""

    procedure_ids: list[str] = Field(description="Ids to follow at /v1/procedures/{id}.")


class ProcedureOut(_Out):
    """A procedure, running or finished."""

    id: str
    kind: str = Field(description="e.g. `wal_purge`.")
    topic: str | None
    state: ProcedureStateName
    step: str | None = Field(description="Current step, or the one it ended in.")
    attempts: int = Field(ge=0, description="Executions of the current (or last) step.")
    error: str | None = Field(description="Last error message.")
    error_code: str | None = Field(description="Stable code of the last error.")
    reason: str = Field(description="Why it was submitted (`manual`, `ticker`, ...).")
    outcome: str | None = Field(description="Terminal summary (skip reason, purge result).")
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    timings: dict[str, float] = Field(description="Seconds spent per finished step.")
    data: dict[str, Any] = Field(description="The procedure's own data (prune point, ...).")

    @classmethod
    def of(cls, view: ProcedureView) -> ProcedureOut:
        """From the manager's view."""
        return cls(
            id=view.id,
            kind=view.kind,
            topic=view.topic,
            state=view.state.value,
            step=view.step or None,
            attempts=view.attempts,
            error=view.error,
            error_code=view.error_code,
            reason=view.reason,
            outcome=view.outcome,
            submitted_at=datetime.fromtimestamp(view.submitted_at, tz=UTC),
            started_at=_at(view.started_at),
            finished_at=_at(view.finished_at),
            timings=dict(view.timings),
            data=dict(view.data),
        )


class ProcedureList(_Out):
    """`GET /v1/procedures` answer, newest first."""

    procedures: list[ProcedureOut]


class PurgeRecordOut(_Out):
    """One completed purge."""

    procedure_id: str
    topic: str
    prune_point: int = Field(description="Offsets below it were deleted (or released).")
    previous_pruned_entry_id: int | None
    previous_log_start: int | None
    low_watermark: int | None = Field(description="Log start after the purge (null: logical).")
    entries_deleted: int
    bytes_estimated: int
    logical_delete: bool
    duration_s: float
    finished_at: datetime

    @classmethod
    def of(cls, row: PurgeRow) -> PurgeRecordOut:
        """From a history row."""
        return cls(
            procedure_id=row.procedure_id,
            topic=row.topic,
            prune_point=row.prune_point,
            previous_pruned_entry_id=row.previous_pruned_entry_id,
            previous_log_start=row.previous_log_start,
            low_watermark=row.low_watermark,
            entries_deleted=row.entries_deleted,
            bytes_estimated=row.bytes_estimated,
            logical_delete=row.logical_delete,
            duration_s=row.duration_s,
            finished_at=datetime.fromtimestamp(row.finished_at, tz=UTC),
        )


class PurgeHistory(_Out):
    """`GET /v1/purge/history` answer, newest first."""

    purges: list[PurgeRecordOut]


class WalEventOut(_Out):
    """One WAL event, e.g. `wal_data_loss`."""

    topic: str
    kind: str
    region_id: int | None
    details: dict[str, Any]
    at: datetime

    @classmethod
    def of(cls, row: WalEventRow) -> WalEventOut:
        """From a history row."""
        return cls(
            topic=row.topic,
            kind=row.kind,
            region_id=row.region_id,
            details=dict(row.details),
            at=datetime.fromtimestamp(row.at, tz=UTC),
        )


class WalEventList(_Out):
    """`GET /v1/events` answer, newest first."""

    events: list[WalEventOut]
