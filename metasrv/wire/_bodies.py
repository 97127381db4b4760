"""The bodies of every endpoint but the heartbeat (DESIGN §5), requests and answers.

Requests are strict: no coercion ("5" is not 5), unknown fields rejected. Answers ignore
unknown fields when a client decodes them, so a newer server does not break an older
client. Field descriptions are what the OpenAPI document shows.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from msgspec import Meta, Struct

from metasrv.wire._types import (
    FAILED_STATES,
    BlockReason,
    FindingKind,
    Id,
    ProcedureState,
    Severity,
    TopicName,
)

MAX_PURGE_TOPICS = 10_000
"""Most topics one purge request may name."""


class Request(Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of request bodies."""


class Answer(Struct, kw_only=True):
    """Base of response bodies."""


def _doc(text: str) -> Meta:
    return Meta(description=text)


# --- errors --------------------------------------------------------------------------------


class ErrorDetail(Struct, kw_only=True):
    """`code` is stable and machine-readable; other fields depend on the code (e.g.
    `leader` on a 421, `errors` on a 422)."""

    code: str
    message: str


class ErrorBody(Answer):
    """Every error response."""

    error: ErrorDetail


# --- regions -------------------------------------------------------------------------------


class RegisterRegion(Request):
    """`POST /v1/regions`."""

    region_id: Annotated[Id, Meta(examples=[(1024 << 32) | 1])]
    node_id: Id
    topic: Annotated[
        TopicName | None,
        _doc("Pin the region to this topic; default: the least-loaded pool topic."),
    ] = None


class RegisteredRegion(Answer):
    region_id: int
    topic: str
    node_id: int


class RegionStat(Answer):
    """The latest heartbeat stat of a region."""

    node_id: int
    flushed_entry_id: int
    topic_latest_entry_id: int | None
    memtable_bytes: int
    manifest_version: int | None
    prunable_entry_id: int
    idle_claim_ignored: Annotated[
        bool, _doc("`topic_latest_entry_id` came with a non-empty memtable, so it is not used.")
    ]
    age_seconds: float


class Region(Answer):
    """`GET /v1/regions/{region_id}`."""

    region_id: int
    topic: str
    node_id: int
    checkpoint_entry_id: int | None
    stat: RegionStat | None
    prunable_entry_id: int | None
    pruned_entry_id: int | None
    replay_start_entry_id: int


class RegionList(Answer):
    regions: list[Region]


class ReplayStart(Answer):
    """`GET /v1/regions/{region_id}/replay-start`."""

    region_id: int
    topic: str
    start_entry_id: Annotated[
        int,
        _doc(
            "max(prunable_entry_id, pruned_entry_id, target of an unfinished purge) + 1; "
            "a datanode reads from max(this, its own flushed_entry_id + 1)"
        ),
    ]
    log_start_offset: Annotated[
        int | None,
        _doc(
            "Kafka's log start offset of the topic's partition 0 (its first readable entry); "
            "null when Kafka did not answer in time (then `archive` is null too, and a "
            "consumer started below the log start fails: `auto.offset.reset=error`)."
        ),
    ] = None
    archive: Annotated[
        list[ArchivedObject] | None,
        _doc(
            "When start_entry_id < log_start_offset and the WAL archive holds every entry of "
            "[start_entry_id, log_start_offset) (DESIGN §8): the objects to replay first, in "
            "entry order (they may overlap: skip entries already replayed), then Kafka from "
            "log_start_offset. Otherwise null: the archive is disabled, not needed, or has a "
            "gap there."
        ),
    ] = None


class ArchivedObject(Answer):
    """One object of the WAL archive: Parquet rows `entry_id`, `timestamp_ms`, `key`,
    `value`, `headers` of the entries first_entry_id..last_entry_id (DESIGN §8)."""

    bucket: str
    key: str
    first_entry_id: int
    last_entry_id: Annotated[int, _doc("Included.")]


# --- topics and plans ----------------------------------------------------------------------


class ResolveReset(Request):
    """`POST /v1/topics/{topic}/resolve-reset`."""

    topic_id: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=64,
            description=(
                "Kafka's current id of the topic (as `kafka-topics.sh --describe` prints "
                "it): the operator resolves the topic they looked at."
            ),
        ),
    ]


class ResetResolved(Answer):
    """A topic reset resolved: the marker is `{"pruned_entry_id": null, "topic_id": ...}`."""

    topic: str
    topic_id: Annotated[str, _doc("Kafka's topic id the marker now records.")]
    regions: Annotated[
        int, _doc("Regions whose stats were dropped: each must report again before a purge.")
    ]
    previous_pruned_entry_id: Annotated[
        int | None, _doc("The marker's entry id before (offsets of the old topic).")
    ]
    reset_reason: Annotated[str, _doc("Why the reset was latched.")]


class BlockingRegion(Answer, kw_only=True, omit_defaults=True):
    """What keeps a topic from being purged: a region (`region_id`) or, instead, a pinned
    consumer group (`consumer_group`, DESIGN §5 and §8) or the topic itself (`topic`, the
    WAL archive's `not_archived`); exactly one of the three is present."""

    region_id: int | None = None
    consumer_group: Annotated[
        str | None, _doc("A pinned consumer group with no committed offset on the topic.")
    ] = None
    topic: Annotated[
        str | None,
        _doc(
            "The topic itself: its last purge found the WAL archive short of "
            "[log start, target) (`not_archived`) and deleted nothing."
        ),
    ] = None
    reason: BlockReason


class PinnedGroup(Answer):
    """A pinned consumer group (`[wal] pin_consumer_groups`) as the topic's plan saw it."""

    consumer_group: str
    committed_offset: Annotated[
        int | None,
        _doc("Its committed offset on partition 0 (the next entry it reads); null: none."),
    ]
    lag: Annotated[
        int | None, _doc("High watermark - committed offset; null when either is unknown.")
    ]
    holds_prune_point: Annotated[
        bool,
        _doc("Its committed offset is what holds the prune point below the regions' need."),
    ]


class TopicPlan(Answer, kw_only=True):
    """One topic's prune plan."""

    topic: str
    prune_point: Annotated[
        int | None,
        _doc("Offsets below it may be deleted, and the marker moves to it; null if blocked."),
    ]
    pruned_entry_id: int | None
    log_start_offset: int | None
    high_watermark: int | None
    blocked_by: list[BlockingRegion]
    reclaimable_entries: int
    data_loss: Annotated[list[int], _doc("Regions whose needed entries Kafka no longer holds.")]
    region_count: int
    kafka_unavailable: Annotated[
        str | None,
        _doc(
            "Why Kafka's offsets of the topic cannot be read now (prune_point is then null); "
            "null when they were read."
        ),
    ] = None
    topic_reset: Annotated[
        str | None,
        _doc(
            "Why the topic is a topic reset (deleted and recreated, or truncated under "
            "metasrv: WAL data loss; nothing is purged until an operator resolves it with "
            "`POST /v1/topics/{topic}/resolve-reset`); null when it is not."
        ),
    ] = None
    topic_id: Annotated[str | None, _doc("Kafka's topic id, when its offsets were read.")] = None
    not_archived: Annotated[
        str | None,
        _doc(
            "Why the last purge of the topic deleted nothing: the WAL archive's bucket did "
            "not hold [log start, target) with no gap, or did not answer (also in "
            "`blocked_by` as the topic, `not_archived`); null when its check passed or "
            "this leader process has not checked the topic. The prune point stays: the next "
            "purge checks the bucket again."
        ),
    ] = None
    pinned_groups: Annotated[
        list[PinnedGroup],
        _doc(
            "Every pinned consumer group: its committed offset bounds the prune point "
            "(DESIGN §8); one with none blocks the topic (in `blocked_by`)."
        ),
    ] = []


class PlanList(Answer):
    topics: list[TopicPlan]


class Topic(TopicPlan, kw_only=True):
    """`GET /v1/topics/{topic}`: the plan plus what datanodes report about the topic."""

    pool: Annotated[bool, _doc("A `{prefix}_{n}` pool topic.")]
    latest_entry_id: Annotated[int | None, _doc("Highest entry id a datanode reported.")]
    avg_record_size: Annotated[float | None, _doc("Bytes per record, recent average.")]
    replication_factor: Annotated[
        int | None, _doc("Replicas of partition 0 in Kafka's metadata; null when unknown.")
    ] = None
    min_insync_replicas: Annotated[
        int | None,
        _doc(
            "Effective `min.insync.replicas` (the topic's own or the brokers' default, as "
            "Kafka describes it); null when unknown."
        ),
    ] = None


class TopicList(Answer):
    topics: list[Topic]


# --- purge, procedures, history ------------------------------------------------------------


class PurgeRequest(Request):
    """`POST /v1/purge`."""

    topics: (
        Annotated[
            list[TopicName],
            Meta(
                min_length=1,
                max_length=MAX_PURGE_TOPICS,
                description="Topics to purge (deduplicated); null purges every topic with regions.",
            ),
        ]
        | None
    ) = None
    dry_run: Annotated[bool, _doc("Return the plan; submit nothing.")] = False


class PurgeSubmitted(Answer):
    procedure_ids: Annotated[list[str], _doc("Ids to follow at /v1/procedures/{id}.")]


class Procedure(Answer):
    """A procedure, running or finished."""

    id: str
    kind: Annotated[str, _doc("e.g. `wal_purge`.")]
    topic: str | None
    state: ProcedureState
    step: Annotated[str | None, _doc("Current step, or the one it ended in.")]
    attempts: Annotated[int, Meta(ge=0, description="Executions of the current (or last) step.")]
    error: Annotated[str | None, _doc("Last error message.")]
    error_code: Annotated[str | None, _doc("Stable code of the last error.")]
    reason: Annotated[str, _doc("Why it was submitted (`manual`, `ticker`, ...).")]
    outcome: Annotated[str | None, _doc("Terminal summary (skip reason, purge result).")]
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    timings: Annotated[dict[str, float], _doc("Seconds spent per finished step.")]
    data: Annotated[dict[str, Any], _doc("The procedure's own data (prune point, ...).")]

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def failed(self) -> bool:
        """Ended without doing its work (failed or cancelled)."""
        return self.state in FAILED_STATES


class ProcedureList(Answer):
    """Newest first."""

    procedures: list[Procedure]


class PurgeRecord(Answer):
    """One completed purge."""

    procedure_id: str
    topic: str
    prune_point: Annotated[int, _doc("Offsets below it were deleted (or released).")]
    previous_pruned_entry_id: int | None
    previous_log_start: int | None
    low_watermark: Annotated[int | None, _doc("Log start after the purge (null: logical).")]
    entries_deleted: int
    bytes_estimated: int
    logical_delete: bool
    duration_s: float
    finished_at: datetime


class PurgeHistory(Answer):
    """Newest first."""

    purges: list[PurgeRecord]


class WalEvent(Answer):
    """One WAL event: WAL data loss, or a moment of a prune attempt (`EventKind`)."""

    topic: str
    kind: Annotated[str, _doc("An `EventKind` value, e.g. `purge_deleted`, `wal_data_loss`.")]
    region_id: Annotated[int | None, _doc("The region that lost entries (`wal_data_loss`).")]
    details: Annotated[dict[str, Any], _doc("Kind-specific extras (`error_code`, ...).")]
    at: datetime
    id: Annotated[int | None, _doc("Row id; a process's later events have higher ids.")] = None
    procedure_id: Annotated[str | None, _doc("The purge procedure it belongs to.")] = None
    target: Annotated[
        int | None, _doc("P: the offset the purge deletes below and the marker it writes.")
    ] = None
    log_start_before: Annotated[
        int | None, _doc("Kafka's log start offset when the purge planned.")
    ] = None
    log_start_after: Annotated[
        int | None, _doc("Kafka's log start offset after the deletion (`purge_deleted`).")
    ] = None
    high_watermark: Annotated[
        int | None, _doc("Kafka's high watermark (latest offset + 1) when the purge planned.")
    ] = None
    message: Annotated[
        str | None, _doc("Why it was skipped, the error of a retry or failure, what it cut.")
    ] = None


class WalEventList(Answer):
    """Newest first."""

    events: list[WalEvent]


# --- WAL trend (the dashboard's plots) ----------------------------------------------------


class TrendPurge(Answer):
    """One completed purge on the trend's time axis."""

    at: Annotated[float, _doc("Finish time, Unix seconds.")]
    topic: str
    procedure_id: str
    prune_point: int
    entries_deleted: Annotated[int, _doc("Entries freed (released, with logical deletion).")]
    bytes_estimated: int
    logical_delete: bool


class TrendSeries(Answer):
    """One topic's retained WAL, aligned with `WalTrend.at`; null where it was not sampled."""

    topic: str
    entries: Annotated[list[int | None], _doc("Kafka's high watermark - log start.")]
    bytes: Annotated[
        list[int | None],
        _doc("Entries x the average record size datanodes report; null before any report."),
    ]


class WalTrend(Answer):
    """`GET /v1/purge/trend`: the WAL each topic retained over the last `window_s`, and
    the purges that cut it, as the leader sampled them (`[dashboard]` settings)."""

    sample_interval_s: Annotated[float, _doc("0: no trend is kept.")]
    window_s: float
    at: Annotated[list[float], _doc("Sample times, Unix seconds, oldest first.")]
    total_entries: Annotated[list[int | None], _doc("Over every topic sampled.")]
    total_bytes: Annotated[list[int | None], _doc("Over every topic with a known size.")]
    topic_count: Annotated[int, _doc("Topics sampled; `topics` holds those asked for.")]
    topics: Annotated[list[TrendSeries], _doc("Largest retained WAL now first.")]
    purges: Annotated[list[TrendPurge], _doc("Every topic's, oldest first.")]


class ArchivedTopic(Answer):
    """What the WAL archive held of one topic when a purge (or a replay-start, or a data-loss
    report) last listed it."""

    topic: str
    first_entry_id: Annotated[int | None, _doc("Lowest archived entry; null: no object.")]
    end: Annotated[
        int | None, _doc("One past the last entry of the gapless run from `first_entry_id`.")
    ]
    gap: Annotated[bool, _doc("Objects lie beyond a gap after `end`.")]
    objects: int
    listed_at: Annotated[float, _doc("Unix seconds.")]


class ArchivedList(Answer):
    """`GET /v1/purge/archived`: the leader's last listing of each topic's WAL archive (no
    store call per request; empty while the archive is off or nothing listed it yet)."""

    enabled: Annotated[bool, _doc("`[wal.archive] enabled`.")]
    topics: list[ArchivedTopic]


# --- leader, health, reconcile -------------------------------------------------------------


class Leader(Answer):
    """`GET /v1/leader`."""

    leader: Annotated[str | None, _doc("HTTP address of the leader, if known.")]
    is_leader: Annotated[bool, _doc("True when the answering process leads.")]
    serving: Annotated[bool, _doc("Leader with its topic-region map loaded.")]
    term: int
    node: Annotated[str, _doc("The answering process's election name.")]


class Health(Answer):
    status: str


class Ready(Answer):
    """`GET /readyz` (200 only when every check is "ok")."""

    status: str
    checks: dict[str, str]
    is_leader: bool


class ReconcileFinding(Answer):
    kind: FindingKind
    severity: Severity
    topic: str | None
    region_id: int | None
    message: str
    evidence: Annotated[dict[str, Any], _doc("The observed values the finding rests on.")]
    action: Annotated[str | None, _doc("What --apply did about it, if anything.")]


class ReconcileRun(Answer):
    run_id: str
    started_at: datetime
    finished_at: datetime
    status: str
    master: str
    applied: bool
    kv_revision: int | None
    counts: Annotated[dict[str, dict[str, int]], _doc("kind -> severity -> findings")]
    findings_total: int
    findings_stored: Annotated[int, _doc("Findings kept in SQL (the Parquet has all).")]
    out_dir: str | None
    summary: dict[str, Any]


class ReconcileLatest(Answer):
    """The newest reconcile run with one page of its findings, most urgent first."""

    run: ReconcileRun
    findings: list[ReconcileFinding]
    matched: Annotated[int, _doc("Stored findings matching the filters.")]
    limit: int
    offset: int


ANSWERS: tuple[type[Struct], ...] = (
    ErrorBody,
    RegisteredRegion,
    Region,
    RegionList,
    ReplayStart,
    PlanList,
    Topic,
    TopicList,
    PurgeSubmitted,
    Procedure,
    ProcedureList,
    PurgeHistory,
    WalEventList,
    WalTrend,
    ArchivedList,
    Leader,
    Health,
    Ready,
    ReconcileLatest,
    ResetResolved,
)
REQUESTS: tuple[type[Struct], ...] = (RegisterRegion, PurgeRequest, ResolveReset)
