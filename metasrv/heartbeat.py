"""Heartbeat ingest (DESIGN §5 `POST /v1/heartbeat`): the leader's hot path.

One heartbeat carries a datanode's stats for up to thousands of regions, and the leader
takes hundreds of heartbeats a second, so this module decodes and type-checks the body in
one pass in C with msgspec (into `msgspec.Struct`s that the garbage collector does not
track), leaving the Python loop only the registry logic: one dict lookup per region for
its previous stat (or its route), one tuple per accepted region
(`metasrv.registry.StatRow`), one dict update per topic. The whole body is validated
before anything is stored: a malformed heartbeat (422) changes nothing. A body msgspec
refuses is parsed again with orjson and checked field by field, only to say what is
wrong and where.

Per-region rejections (the region is listed, nothing is stored for it, the rest of the
heartbeat is accepted):
- `negative_id`: region_id < 0, or flushed/topic-latest entry id below -1;
- `unknown_region`: not in the topic-region map;
- `topic_mismatch`: reported on a topic other than its mapped one;
- `stat_regressed`: a lower `flushed_entry_id` than the stored stat at the same or a
  newer manifest version (a lower manifest version means the region was re-created,
  and its lower flushed id is the truth).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Final

import msgspec
import orjson

from metasrv.checkpoints import Checkpointer
from metasrv.errors import InvalidArgument
from metasrv.mailbox import Mailbox
from metasrv.metrics import Metrics
from metasrv.model import RegionStat
from metasrv.registry import (
    FLUSHED,
    MANIFEST,
    NODE,
    PRUNABLE,
    TOPIC,
    RegionRegistry,
    StatRow,
    StatSnapshot,
)
from metasrv.topology import Topology

NEGATIVE_ID: Final = "negative_id"
UNKNOWN_REGION: Final = "unknown_region"
TOPIC_MISMATCH: Final = "topic_mismatch"
STAT_REGRESSED: Final = "stat_regressed"
REJECT_REASONS: Final = (NEGATIVE_ID, UNKNOWN_REGION, TOPIC_MISMATCH, STAT_REGRESSED)

_REGION_FIELDS: Final = (
    "region_id",
    "topic",
    "flushed_entry_id",
    "topic_latest_entry_id",
    "memtable_bytes",
    "manifest_version",
)


# msgspec checks integer bounds only within int64, and decodes wider integers exactly,
# where orjson parses [-2**63, 2**64) as `int` and anything wider as a float (refused by
# the field checks). So the fast path takes int64 values; a body it refuses goes through
# the field checks, which accept the [2**63, 2**64) ids orjson always took.
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_Int = Annotated[int, msgspec.Meta(ge=_I64_MIN, le=_I64_MAX)]
_NonNegative = Annotated[int, msgspec.Meta(ge=0, le=_I64_MAX)]


class _Region(msgspec.Struct, gc=False):
    """One `regions[]` entry as decoded; unknown fields are ignored, as before."""

    region_id: _Int
    topic: str
    flushed_entry_id: _Int
    memtable_bytes: _NonNegative
    topic_latest_entry_id: _Int | None = None
    manifest_version: _NonNegative | None = None


class _TopicReport(msgspec.Struct, gc=False):
    """One `topics[]` entry as decoded."""

    topic: Annotated[str, msgspec.Meta(min_length=1)]
    latest_entry_id: Annotated[int, msgspec.Meta(ge=-1, le=_I64_MAX)]
    record_size: _NonNegative
    record_num: _NonNegative


class _Heartbeat(msgspec.Struct, gc=False):
    """A heartbeat body (DESIGN §5) as decoded."""

    node_id: _NonNegative
    regions: list[_Region]
    addr: str | None = None
    topics: list[_TopicReport] | None = None


_decode: Final = msgspec.json.Decoder(_Heartbeat).decode


def _invalid(message: str, loc: list[Any]) -> InvalidArgument:
    return InvalidArgument(message, details={"errors": [{"loc": ["body", *loc], "msg": message}]})


def _explain_region(index: int, region: Any) -> InvalidArgument | None:
    """What is wrong with one parsed region entry, if anything."""
    loc: list[Any] = ["regions", index]
    if type(region) is not dict:
        return _invalid("each region must be a JSON object", loc)
    for name in ("region_id", "flushed_entry_id", "memtable_bytes"):
        if name not in region:
            return _invalid(f"field required: {name}", [*loc, name])
        if type(region[name]) is not int:
            return _invalid(f"{name} must be an integer", [*loc, name])
    if type(region.get("topic")) is not str:
        return _invalid("topic must be a string", [*loc, "topic"])
    for name in ("topic_latest_entry_id", "manifest_version"):
        value = region.get(name)
        if value is not None and type(value) is not int:
            return _invalid(f"{name} must be an integer or null", [*loc, name])
    if region["memtable_bytes"] < 0:
        return _invalid("memtable_bytes must be >= 0", [*loc, "memtable_bytes"])
    manifest = region.get("manifest_version")
    if manifest is not None and manifest < 0:
        return _invalid("manifest_version must be >= 0", [*loc, "manifest_version"])
    return None


def _explain_topic_report(index: int, report: Any) -> InvalidArgument | None:
    """What is wrong with one parsed topic report, if anything."""
    loc: list[Any] = ["topics", index]
    if type(report) is not dict:
        return _invalid("each topic report must be a JSON object", loc)
    topic = report.get("topic")
    if type(topic) is not str or not topic:
        return _invalid("topic must be a non-empty string", [*loc, "topic"])
    for name, lowest in (("latest_entry_id", -1), ("record_size", 0), ("record_num", 0)):
        value = report.get(name)
        if type(value) is not int:
            return _invalid(f"{name} must be an integer", [*loc, name])
        if value < lowest:
            return _invalid(f"{name} must be >= {lowest}", [*loc, name])
    return None


def _parse_checked(body: bytes) -> _Heartbeat:
    """The slow path for a body the decoder refused: parse it with orjson and check it
    field by field, raising the first problem (with its location) as `InvalidArgument`,
    or return it when it is valid after all (an integer in [2**63, 2**64))."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}") from None
    if type(doc) is not dict:
        raise _invalid("the body must be a JSON object", [])
    node_id = doc.get("node_id")
    if type(node_id) is not int or node_id < 0:
        raise _invalid("node_id must be an integer >= 0", ["node_id"])
    addr = doc.get("addr")
    if addr is not None and type(addr) is not str:
        raise _invalid("addr must be a string or null", ["addr"])
    regions = doc.get("regions")
    if type(regions) is not list:
        raise _invalid("regions must be a list", ["regions"])
    topic_reports = doc.get("topics")
    if topic_reports is None:
        topic_reports = []
    elif type(topic_reports) is not list:
        raise _invalid("topics must be a list", ["topics"])
    for index, region in enumerate(regions):
        problem = _explain_region(index, region)
        if problem is not None:
            raise problem
    for index, report in enumerate(topic_reports):
        problem = _explain_topic_report(index, report)
        if problem is not None:
            raise problem
    # Every field checked: build the structs directly (their constructors do not
    # re-check bounds, so the [2**63, 2**64) values pass as they always did).
    return _Heartbeat(
        node_id=node_id,
        addr=addr,
        regions=[
            _Region(
                region_id=r["region_id"],
                topic=r["topic"],
                flushed_entry_id=r["flushed_entry_id"],
                memtable_bytes=r["memtable_bytes"],
                topic_latest_entry_id=r.get("topic_latest_entry_id"),
                manifest_version=r.get("manifest_version"),
            )
            for r in regions
        ],
        topics=[
            _TopicReport(
                topic=t["topic"],
                latest_entry_id=t["latest_entry_id"],
                record_size=t["record_size"],
                record_num=t["record_num"],
            )
            for t in topic_reports
        ],
    )


class HeartbeatHandler:
    """Validates and applies heartbeats; `handle(body) -> response body`."""

    def __init__(
        self,
        registry: RegionRegistry,
        topology: Topology,
        mailbox: Mailbox,
        checkpointer: Checkpointer,
        metrics: Metrics,
        *,
        leader_addr: Callable[[], str | None],
        clock: Callable[[], float] = time.monotonic,
        on_misrouted: Callable[[list[RegionStat]], None] | None = None,
    ) -> None:
        self._registry = registry
        self._topology = topology
        self._mailbox = mailbox
        self._checkpointer = checkpointer
        self._metrics = metrics
        self._leader_addr = leader_addr
        self._clock = clock
        # Reports of unmapped regions, or on a topic other than the mapped one, are stored
        # nowhere here; the stat history keeps them for the reconcile job.
        self._on_misrouted = on_misrouted
        self._heartbeats = metrics.heartbeats
        self._region_stats = metrics.region_stats
        self._rejected = {r: metrics.region_stats_rejected.labels(r) for r in REJECT_REASONS}

    def handle(self, body: bytes) -> bytes:
        """Apply one heartbeat body; return the JSON response body.

        Raises `InvalidArgument` (HTTP 422) for a body that is not the DESIGN §5 shape;
        nothing is stored in that case.
        """
        try:
            doc = _decode(body)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            # msgspec reports invalid UTF-8 in a string and deep nesting with these; the
            # checked path answers them (and every other refusal) with a 422.
            doc = _parse_checked(body)
        node_id = doc.node_id
        addr = doc.addr

        now = self._clock()
        accepted: dict[str, dict[int, StatRow]] = {}  # by topic, as the registry stores them
        changed: list[int] = []
        rejected: list[dict[str, Any]] = []
        misrouted: list[RegionStat] = []
        keep_misrouted = self._on_misrouted is not None
        route_of = self._topology.routes.get
        buckets = self._registry.buckets.get

        # The hot loop: types and bounds were checked by the decoder; locals only, one
        # allocation per valid region (its row tuple).
        for region in doc.regions:
            region_id = region.region_id
            topic = region.topic
            flushed = region.flushed_entry_id
            latest = region.topic_latest_entry_id
            manifest = region.manifest_version
            memtable = region.memtable_bytes

            if region_id < 0 or flushed < -1 or (latest is not None and latest < -1):
                rejected.append({"region_id": region_id, "reason": NEGATIVE_ID})
                continue
            # The previous row is looked up in the bucket of the topic the datanode
            # names. Rows are only stored for mapped regions under their mapped topic and
            # dropped when a region leaves the map (Topology removal listeners) or
            # leadership changes, so a row found there proves the region is mapped to
            # this topic: the steady state skips the route lookup, and the bucket is a
            # small dict that stays in cache.
            bucket = buckets(topic)
            old = bucket.get(region_id) if bucket is not None else None
            if old is not None:
                mapped_topic = old[TOPIC]  # equals `topic`: the bucket is keyed by it
                if flushed < old[FLUSHED]:
                    old_manifest = old[MANIFEST]
                    if manifest is None or old_manifest is None or manifest >= old_manifest:
                        rejected.append({"region_id": region_id, "reason": STAT_REGRESSED})
                        continue
            else:
                route = route_of(region_id)
                if route is None or route.topic != topic:
                    reason = UNKNOWN_REGION if route is None else TOPIC_MISMATCH
                    rejected.append({"region_id": region_id, "reason": reason})
                    if keep_misrouted:
                        misrouted.append(
                            RegionStat(
                                region_id, node_id, topic, flushed, latest, memtable, manifest, now
                            )
                        )
                    continue
                mapped_topic = route.topic

            batch = accepted.get(mapped_topic)
            if batch is None:
                batch = accepted[mapped_topic] = {}
            prunable = flushed if latest is None or latest < flushed else latest
            # The route's topic string, not the parsed copy: a million rows share one.
            batch[region_id] = (
                node_id,
                mapped_topic,
                flushed,
                latest,
                memtable,
                manifest,
                now,
                prunable,
            )
            # Checkpoints hold the prunable id and node: a change in either makes the
            # region dirty. Most heartbeats of an idle region change nothing.
            if old is None or old[PRUNABLE] != prunable or old[NODE] != node_id:
                changed.append(region_id)

        # Everything validated: apply.
        registry = self._registry
        registry.put_topic_rows(accepted)
        registry.note_node(node_id, addr, now)
        for report in doc.topics or ():
            registry.report_topic(
                node_id,
                report.topic,
                report.latest_entry_id,
                report.record_size,
                report.record_num,
                now,
            )
        if changed:
            self._checkpointer.mark(changed)
        mailbox = self._mailbox
        if mailbox.has_pending(node_id):
            mailbox.observe(node_id, StatSnapshot(accepted))

        self._heartbeats.inc()
        count = sum(map(len, accepted.values()))
        if count:
            self._region_stats.inc(count)
        for item in rejected:
            self._rejected[item["reason"]].inc()
        if misrouted and self._on_misrouted is not None:
            self._on_misrouted(misrouted)
        return orjson.dumps(
            {
                "leader": self._leader_addr(),
                "instructions": mailbox.pending_wire(node_id),
                "rejected": rejected,
            }
        )
