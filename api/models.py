"""Request and response models of the metadata-plane endpoints (DESIGN §5).

Requests are strict (no coercion of "5" to 5, unknown fields rejected). The heartbeat
models only document the wire format in OpenAPI: the hot path never builds them (see
metasrv/heartbeat.py), it validates the same shape by hand.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from api.queries import RegionView, ReplayStart, TopicView
from metasrv.heartbeat_wire import MAX_REGIONS, MAX_TOPIC_REPORTS
from metasrv.model import ID_MAX, TopicPlan

RegionId = Annotated[StrictInt, Field(ge=0, le=ID_MAX, examples=[(1024 << 32) | 1])]
"""`table_id << 32 | region_number`."""
NodeId = Annotated[StrictInt, Field(ge=0, le=ID_MAX)]
"""Datanode id."""
TopicName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=249,
        # Kafka's legal names: [A-Za-z0-9._-], but not "." or ".." (no look-around here:
        # the pattern is also the OpenAPI document's, for every client's validator).
        pattern=r"^([A-Za-z0-9_-]|\.[A-Za-z0-9_-]|\.\.[A-Za-z0-9._-])[A-Za-z0-9._-]*$",
        examples=["wal_0"],
    ),
]
"""A topic name Kafka accepts (a collision with an existing topic is found on creation)."""
EntryId = Annotated[int, Field(ge=-1, le=ID_MAX)]
_Count = Annotated[int, Field(ge=0, le=ID_MAX)]
_Int64 = Annotated[int, Field(ge=-ID_MAX - 1, le=ID_MAX)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- errors --------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    """`code` is stable and machine-readable; other fields depend on the code."""

    model_config = ConfigDict(extra="allow")
    code: str
    message: str


class ErrorBody(BaseModel):
    """Every error response."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Request body is not decodable (e.g. not UTF-8)."},
    401: {"model": ErrorBody, "description": "Missing or unknown bearer token."},
    403: {"model": ErrorBody, "description": "The token's role may not call this endpoint."},
    413: {"model": ErrorBody, "description": "Request body over `http.body_limit`."},
    414: {"model": ErrorBody, "description": "Request target over `http.url_limit`."},
    421: {"model": ErrorBody, "description": "This metasrv is a follower; `leader` names it."},
    422: {"model": ErrorBody, "description": "Request does not match the schema."},
    503: {"model": ErrorBody, "description": "New leader still loading, or a dependency is down."},
}
"""Error statuses every leader endpoint may answer (documented in OpenAPI)."""


# --- heartbeat (documentation only) --------------------------------------------------------


class RegionReport(_In):
    """One region's stat in a heartbeat."""

    region_id: _Int64
    """Negative: rejected as `negative_id`. Each region at most once per heartbeat."""
    topic: str
    flushed_entry_id: _Int64
    """Below -1: rejected as `negative_id`."""
    topic_latest_entry_id: _Int64 | None = None
    """Used only with `memtable_bytes == 0` (DESIGN §1)."""
    memtable_bytes: _Count
    manifest_version: _Count | None = None


class TopicReport(_In):
    """One topic's counters in a heartbeat (`record_size`/`record_num` are cumulative)."""

    topic: Annotated[str, Field(min_length=1)]
    """Reports for topics the map does not know are ignored."""
    latest_entry_id: EntryId
    record_size: _Count
    record_num: _Count


class HeartbeatRequest(_In):
    """`POST /v1/heartbeat` body."""

    node_id: NodeId
    addr: str | None = None
    regions: Annotated[list[RegionReport], Field(max_length=MAX_REGIONS)]
    """Each region at most once."""
    topics: Annotated[list[TopicReport], Field(max_length=MAX_TOPIC_REPORTS)] = []


class Instruction(_Out):
    """An instruction for the datanode; repeated until applied or expired."""

    id: str
    kind: Literal["flush_regions"]
    region_ids: list[int]


class Rejection(_Out):
    """A region whose stat was not stored, and why."""

    region_id: int
    reason: Literal["negative_id", "unknown_region", "topic_mismatch", "stat_regressed"]


class HeartbeatResponse(_Out):
    """`POST /v1/heartbeat` answer."""

    leader: str | None
    instructions: list[Instruction]
    rejected: list[Rejection]


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with `$defs` references inlined (for `openapi_extra`)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


# --- regions -------------------------------------------------------------------------------


class RegisterRegion(_In):
    """`POST /v1/regions` body."""

    region_id: RegionId
    node_id: NodeId
    topic: TopicName | None = Field(
        default=None, description="Pin the region to this topic; default: least-loaded pool topic."
    )


class RegisteredRegion(_Out):
    """`POST /v1/regions` answer."""

    region_id: int
    topic: str
    node_id: int


class RegionStatOut(_Out):
    """The latest heartbeat stat of a region."""

    node_id: int
    flushed_entry_id: int
    topic_latest_entry_id: int | None
    memtable_bytes: int
    manifest_version: int | None
    prunable_entry_id: int
    idle_claim_ignored: bool
    """`topic_latest_entry_id` came with a non-empty memtable, so it is not used."""
    age_seconds: float


class RegionOut(_Out):
    """`GET /v1/regions/{region_id}`."""

    region_id: int
    topic: str
    node_id: int
    checkpoint_entry_id: int | None
    stat: RegionStatOut | None
    prunable_entry_id: int | None
    pruned_entry_id: int | None
    replay_start_entry_id: int

    @classmethod
    def of(cls, view: RegionView) -> RegionOut:
        """From the read-side view."""
        stat = view.stat
        stat_out = None
        if stat is not None:
            stat_out = RegionStatOut(
                node_id=stat.node_id,
                flushed_entry_id=stat.flushed_entry_id,
                topic_latest_entry_id=stat.topic_latest_entry_id,
                memtable_bytes=stat.memtable_bytes,
                manifest_version=stat.manifest_version,
                prunable_entry_id=stat.prunable_entry_id,
                idle_claim_ignored=stat.idle_claim_ignored,
                age_seconds=round(view.stat_age or 0.0, 3),
            )
        route = view.route
        return cls(
            region_id=route.region_id,
            topic=route.topic,
            node_id=route.node_id,
            checkpoint_entry_id=route.checkpoint_entry_id,
            stat=stat_out,
            prunable_entry_id=None if stat is None else stat.prunable_entry_id,
            pruned_entry_id=view.pruned_entry_id,
            replay_start_entry_id=view.replay_start_entry_id,
        )


class RegionList(_Out):
    """`GET /v1/regions`."""

    regions: list[RegionOut]


class ReplayStartOut(_Out):
    """`GET /v1/regions/{region_id}/replay-start`."""

    region_id: int
    topic: str
    start_entry_id: int

    @classmethod
    def of(cls, start: ReplayStart) -> ReplayStartOut:
        """From the domain answer."""
        return cls(
            region_id=start.region_id, topic=start.topic, start_entry_id=start.start_entry_id
        )


# --- topics and plans ----------------------------------------------------------------------


class BlockingRegionOut(_Out):
    """A region that keeps its topic from being purged."""

    region_id: int
    reason: Literal["no_stat", "stale_stat", "retention_overrun"]


class TopicPlanOut(_Out):
    """One topic's prune plan (`GET /v1/purge/plan`)."""

    topic: str
    prune_point: int | None = Field(description="Offsets below it may be deleted; null if blocked.")
    pruned_entry_id: int | None
    log_start_offset: int | None
    high_watermark: int | None
    blocked_by: list[BlockingRegionOut]
    reclaimable_entries: int
    data_loss: list[int] = Field(description="Regions whose needed entries Kafka no longer holds.")
    region_count: int

    @classmethod
    def of(cls, plan: TopicPlan) -> TopicPlanOut:
        """From the pure planner's result."""
        return cls(
            topic=plan.topic,
            prune_point=plan.prune_point,
            pruned_entry_id=plan.pruned_entry_id,
            log_start_offset=plan.log_start_offset,
            high_watermark=plan.high_watermark,
            blocked_by=[
                BlockingRegionOut(region_id=b.region_id, reason=b.reason)  # type: ignore[arg-type]
                for b in plan.blocked_by
            ],
            reclaimable_entries=plan.reclaimable_entries,
            data_loss=list(plan.data_loss),
            region_count=plan.region_count,
        )


class PlanList(_Out):
    """`GET /v1/purge/plan`."""

    topics: list[TopicPlanOut]


class TopicOut(TopicPlanOut):
    """`GET /v1/topics/{topic}`: the plan plus what datanodes report about the topic."""

    pool: bool = Field(description="A `{prefix}_{n}` pool topic.")
    latest_entry_id: int | None = Field(description="Highest entry id a datanode reported.")
    avg_record_size: float | None = Field(description="Bytes per record over the recent window.")

    @classmethod
    def of_view(cls, view: TopicView) -> TopicOut:
        """From the read-side view."""
        plan = TopicPlanOut.of(view.plan).model_dump()
        stat = view.stat
        return cls(
            **plan,
            pool=view.pool,
            latest_entry_id=None if stat is None else stat.latest_entry_id,
            avg_record_size=None if stat is None else round(stat.avg_record_size, 3),
        )


class TopicList(_Out):
    """`GET /v1/topics`."""

    topics: list[TopicOut]


# --- leader and health ---------------------------------------------------------------------


class LeaderOut(_Out):
    """`GET /v1/leader`."""

    leader: str | None = Field(description="HTTP address of the leader, if known.")
    is_leader: bool = Field(description="True when the answering process leads.")
    serving: bool = Field(description="Leader with its topic-region map loaded.")
    term: int
    node: str = Field(description="The answering process's election name.")


class HealthOut(_Out):
    """`GET /healthz`."""

    status: Literal["ok"]


class ReadyOut(_Out):
    """`GET /readyz` (200 only when every check is "ok")."""

    status: Literal["ready", "not_ready"]
    checks: dict[str, str]
    is_leader: bool
