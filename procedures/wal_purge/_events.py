"""What a prune attempt records as WAL events (`metasrv.wire.EventKind`), moment by moment.

Every attempt leaves `purge_started` when a run takes the topic's lock (again when a new
leader resumes it), `purge_retrying` for each step error it retries (the error), and one
terminal event: `purge_deleted`, `purge_skipped` (the reason), `purge_failed` (the
error) or `purge_cancelled`. A purge that finds WAL data loss also leaves one
`wal_data_loss` per region (saying whether the WAL archive holds what Kafka lost: DESIGN
§8); one that finds a topic reset (invariant 8) and latches it,
one `topic_reset` (its reason, the regions concerned, Kafka's and the marker's topic
ids). Each names the topic, the procedure, the target P, Kafka's log start when the
purge planned and after its deletion, and the high watermark, as far as the attempt knew
them at that moment (null otherwise).

Events go through `EventLog` (procedures/_events.py): queued, written in the background,
never in the purge's way. Building one must not be either: `emit` logs a failure and
drops the event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from metasrv.wire import EventKind, ProcedureState, WalEvent
from procedures import EventLog, ProcedureRecord

if TYPE_CHECKING:
    from metasrv.keys import Marker
    from procedures.wal_purge._data import PurgeData
    from procedures.wal_purge._plan import Lost, Reset

logger = logging.getLogger(__name__)

TERMINAL_KINDS: Mapping[ProcedureState, EventKind] = {
    ProcedureState.SUCCEEDED: EventKind.PURGE_DELETED,
    ProcedureState.SKIPPED: EventKind.PURGE_SKIPPED,
    ProcedureState.FAILED: EventKind.PURGE_FAILED,
    ProcedureState.CANCELLED: EventKind.PURGE_CANCELLED,
}


def emit(events: EventLog, build: Callable[[], WalEvent]) -> None:
    """Queue the event `build()` returns; a failure to build it is logged, never raised."""
    try:
        event = build()
    except Exception:
        logger.exception("could not build a prune event")
        return
    events.emit(event)


def attempt_event(
    kind: EventKind,
    data: PurgeData,
    procedure_id: str,
    *,
    at: float,
    message: str | None = None,
    details: Mapping[str, Any] | None = None,
    region_id: int | None = None,
) -> WalEvent:
    """An event of the purge whose persisted data is `data`, at epoch seconds `at`."""
    return WalEvent(
        topic=data.topic,
        kind=kind.value,
        region_id=region_id,
        details=dict(details or {}),
        at=datetime.fromtimestamp(at, tz=UTC),
        procedure_id=procedure_id,
        target=data.target if data.target is not None else data.prune_point,
        log_start_before=data.log_start_offset,
        log_start_after=data.low_watermark,
        high_watermark=data.high_watermark,
        message=message,
    )


def terminal_event(
    record: ProcedureRecord, data: PurgeData, *, logical_delete: bool, at: float
) -> WalEvent:
    """The event of a purge that ended as `record` says (`TERMINAL_KINDS`)."""
    kind = TERMINAL_KINDS[record.state]
    details: dict[str, Any] = {"trigger": record.reason}
    if kind is EventKind.PURGE_DELETED:
        details["logical_delete"] = logical_delete
        details["previous_pruned_entry_id"] = data.previous_pruned_entry_id
    if data.flush:
        details["flush_asked"] = [t.region_id for t in data.flush]
        details["flushed"] = list(data.flushed_regions)
    failed = kind in (EventKind.PURGE_FAILED, EventKind.PURGE_CANCELLED)
    if failed and record.error_code is not None:
        details["error_code"] = record.error_code
    return attempt_event(
        kind,
        data,
        record.id,
        at=record.finished_at if record.finished_at is not None else at,
        message=record.error if failed else record.outcome,
        details=details,
    )


def loss_event(
    data: PurgeData,
    procedure_id: str,
    lost: Lost,
    region_id: int,
    prunable_entry_id: int | None,
    *,
    pruned_entry_id: int | None,
    archive_covers: bool | None,
    at: float,
) -> WalEvent:
    """The `wal_data_loss` event of one region of `lost` (invariant 7). `archive_covers`:
    whether the WAL archive holds every entry the region lost (from its need + 1 up to the
    log start); None when the archive is disabled or its store did not answer."""
    archived = ""
    if archive_covers is not None:
        archived = f"; the WAL archive {'holds' if archive_covers else 'does not hold'} them"
    return attempt_event(
        EventKind.WAL_DATA_LOSS,
        data,
        procedure_id,
        at=at,
        message=f"Kafka's log start {lost.log_start_offset} is above entries region "
        f"{region_id} needs (prunable entry id {prunable_entry_id})"
        f"{archived}",
        details={
            "procedure_id": procedure_id,
            "log_start_offset": lost.log_start_offset,
            "prunable_entry_id": prunable_entry_id,
            "pruned_entry_id": pruned_entry_id,
            "archive_covers": archive_covers,
        },
        region_id=region_id,
    )


def reset_details(reset: Reset, marker: Marker | None) -> dict[str, Any]:
    """What a topic reset's event and error carry: the reason, the regions concerned,
    Kafka's topic id and high watermark now, and the marker's topic id and entry id."""
    return {
        "reason": reset.reason,
        "regions": list(reset.regions),
        "topic_id": reset.topic_id,
        "marker_topic_id": None if marker is None else marker.topic_id,
        "pruned_entry_id": None if marker is None else marker.pruned_entry_id,
        "high_watermark": reset.high_watermark,
    }


def reset_event(
    data: PurgeData, procedure_id: str, reset: Reset, details: Mapping[str, Any], *, at: float
) -> WalEvent:
    """The `topic_reset` event of a purge that found and latched a reset (invariant 8)."""
    return attempt_event(
        EventKind.TOPIC_RESET,
        data,
        procedure_id,
        at=at,
        message=f"topic reset: {reset.reason}; WAL entries regions reported are not in the "
        "topic; nothing is deleted from it until an operator resolves it",
        details=details,
    )
