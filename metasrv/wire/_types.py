"""The scalar types and closed vocabularies of the wire: ids, topic names, states, reasons."""

from __future__ import annotations

import enum
import re
from datetime import UTC, datetime
from typing import Annotated, Final

import msgspec

from metasrv.model import ID_MAX

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=ID_MAX)]
Id = Annotated[int, msgspec.Meta(ge=0, le=ID_MAX)]
"""Region ids (`table_id << 32 | region_number`), node ids, counters."""
EntryId = Annotated[int, msgspec.Meta(ge=-1, le=ID_MAX)]
"""A WAL entry id; -1 is "nothing"."""
TOPIC_PATTERN: Final = r"^([A-Za-z0-9_-]|\.[A-Za-z0-9_-]|\.\.[A-Za-z0-9._-])[A-Za-z0-9._-]*$"
"""Kafka's legal topic names: [A-Za-z0-9._-], but not "." or ".." (no look-around: the
pattern is also the OpenAPI document's, for every client's validator)."""
TOPIC_MAX_LENGTH: Final = 249
TopicName = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=TOPIC_MAX_LENGTH, pattern=TOPIC_PATTERN, examples=["wal_0"]
    ),
]
"""A topic name Kafka accepts (a collision with an existing topic is found on creation)."""


class ProcedureState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    SKIPPED = "skipped"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True once the procedure will never run again."""
        return self in TERMINAL_STATES


TERMINAL_STATES: Final = frozenset(
    {
        ProcedureState.SUCCEEDED,
        ProcedureState.SKIPPED,
        ProcedureState.FAILED,
        ProcedureState.CANCELLED,
    }
)
FAILED_STATES: Final = frozenset({ProcedureState.FAILED, ProcedureState.CANCELLED})
"""Terminal states that mean the procedure did not do its work."""


class EventKind(enum.StrEnum):
    """What a WAL event (`GET /v1/events`) records: WAL data loss, or one moment of a prune
    attempt (a WAL purge procedure)."""

    WAL_DATA_LOSS = "wal_data_loss"
    """Kafka's log start is above entries a region still needs (invariant 7); one per region."""
    TOPIC_RESET = "topic_reset"
    """A topic's offsets went backwards under metasrv or its Kafka topic id changed
    (invariant 8): WAL data loss; nothing is deleted from it until an operator resolves it."""
    TOPIC_RESET_RESOLVED = "topic_reset_resolved"
    """An operator resolved a topic reset (`details`: the topic id now recorded)."""
    PURGE_STARTED = "purge_started"
    """A purge began running (again, when a new leader resumed it)."""
    PURGE_DELETED = "purge_deleted"
    """A purge moved the marker to its target and Kafka's log start is at or past it
    (`details.logical_delete`: the marker only)."""
    PURGE_SKIPPED = "purge_skipped"
    """A purge ended without cutting; `message` says why (blocked, up to date, ...)."""
    PURGE_RETRYING = "purge_retrying"
    """A step failed with a retryable error (`message`, `details.error_code`); it runs again."""
    PURGE_FAILED = "purge_failed"
    """A purge ended on an error (`message`, `details.error_code`)."""
    PURGE_CANCELLED = "purge_cancelled"
    """An operator cancelled a purge before it persisted its target."""


_RFC3339 = re.compile(r"(\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:)(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
RFC3339_EXAMPLE: Final = "2026-11-25T08:00:00Z"


def parse_rfc3339(text: str) -> datetime:
    """An RFC 3339 date-time, which always names its offset (`2026-11-25T08:00:00Z`,
    `2026-11-25T09:00:00.5+01:00`), in UTC; ValueError for anything else, Unix seconds
    and times without an offset included.

    A leap second (`23:59:60`) is read as the last microsecond before it, and a time
    whose UTC falls outside years 1..9999 as the first or last one Python has.
    """
    match = _RFC3339.fullmatch(text)
    if match is None:
        hint = " (a '+' offset is written %2B in a URL)" if " " in text[10:] else ""
        raise ValueError(f"expected an RFC 3339 time with its offset, e.g. {RFC3339_EXAMPLE}{hint}")
    head, second, fraction, offset = match.groups()
    leap = second == "60"
    if leap:
        second, fraction = "59", ".999999"
    try:
        at = datetime.fromisoformat(f"{head}{second}{fraction or ''}{offset}".upper())
    except ValueError as exc:
        raise ValueError(f"not a valid time: {exc}") from None
    try:
        return at.astimezone(UTC)
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC) if at.year > 1 else datetime.min.replace(tzinfo=UTC)


class RejectReason(enum.StrEnum):
    """Why a heartbeat's region stat was not stored (the rest of the heartbeat was)."""

    NEGATIVE_ID = "negative_id"
    """region_id < 0, or flushed/topic-latest entry id below -1."""
    UNKNOWN_REGION = "unknown_region"
    """Not in the topic-region map."""
    TOPIC_MISMATCH = "topic_mismatch"
    """Reported on a topic other than its mapped one."""
    STAT_REGRESSED = "stat_regressed"
    """A lower `flushed_entry_id` than the stored stat at the same or a newer manifest
    version (a lower manifest version means the region was re-created)."""
    WRONG_NODE = "wrong_node"
    """Reported by a datanode other than the one its route names (its old datanode
    after a move: a stale report, not trusted)."""


class BlockReason(enum.StrEnum):
    """Why a region (or a pinned consumer group) keeps its topic from being purged."""

    NO_STAT = "no_stat"
    """The region has never reported to this leader (or reported on another topic)."""
    STALE_STAT = "stale_stat"
    """The region's last report is older than `region_stat_ttl`."""
    RETENTION_OVERRUN = "retention_overrun"
    """Kafka no longer holds entries the region still needs (WAL data loss)."""
    TOPIC_RESET = "topic_reset"
    """The topic's offsets went backwards under metasrv (deleted and recreated, or its
    log truncated): the region's reported entries are not in it (WAL data loss)."""
    NO_COMMITTED_OFFSET = "no_committed_offset"
    """A pinned consumer group (`[wal] pin_consumer_groups`) has no committed offset on
    the topic: nothing may be deleted that it may still read (DESIGN §8)."""
    NOT_ARCHIVED = "not_archived"
    """The topic itself (`topic` instead of a region): with `[wal.archive] enabled`, the last
    purge found that the bucket does not hold [Kafka's log start, target) with no gap, or
    could not list it, and deleted nothing (DESIGN §8, invariant 10)."""


class FindingKind(enum.StrEnum):
    """The inconsistencies the reconcile job looks for."""

    STALE_REGION = "stale_region"
    """Mapped, but no stat for longer than the threshold: it blocks purging its topic."""
    TOPIC_MISMATCH = "topic_mismatch"
    """The region's latest report names a topic other than its mapped one."""
    UNMAPPED_REGION = "unmapped_region"
    """The region reports heartbeats but is not in the topic-region map."""
    MISSING_TOPIC = "missing_topic"
    """A pool topic, or a topic of the map, does not exist in Kafka."""
    ORPHAN_TOPIC = "orphan_topic"
    """A Kafka topic with the pool prefix, outside the pool, with no region mapped."""
    RETENTION_OVERRUN = "retention_overrun"
    """Kafka's log start offset is above a region's prunable entry id + 1: WAL data loss."""
    SKEW = "skew"
    """Regions per pool topic are out of balance."""


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"
