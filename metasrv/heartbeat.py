"""Heartbeat ingest (DESIGN §5 `POST /v1/heartbeat`): the leader's hot path.

One heartbeat carries a datanode's stats for up to thousands of regions, and the leader
takes hundreds of heartbeats a second, so this module decodes and type-checks the body in
one pass in C with msgspec (`metasrv.wire`), leaving the Python loop only the
registry logic: one dict lookup per region for its previous stat (or its route), one
row per accepted region (`metasrv.registry.StatRow`, which the GC does not track), one
dict update per topic. A heartbeat in the columns encoding skips even that loop in the
steady state: its columns are compared with the stored rows' whole (numpy) and the rows
built in C. The whole body is validated before anything is stored: a malformed
heartbeat, or one naming a region twice, is a 422 and changes nothing.

An idle claim (`topic_latest_entry_id`) sent with `memtable_bytes > 0` is stored but not
used for the prune point (`metasrv.model.prunable_entry_id`), and counted in
`metasrv_idle_claims_ignored_total`. Topic reports for topics the map does not know are
dropped and counted (`metasrv_topic_reports_ignored_total`).

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any, Final, cast

import numpy as np
import orjson

from metasrv.checkpoints import Checkpointer
from metasrv.mailbox import Mailbox
from metasrv.metrics import Metrics
from metasrv.model import RegionStat
from metasrv.registry import (
    RegionRegistry,
    StatRow,
    StatSnapshot,
)
from metasrv.topology import Topology
from metasrv.wire import (
    NULL,
    Columns,
    RegionReport,
    RejectReason,
    TopicReport,
    columns_of,
    decode_columns,
    decode_json,
    invalid,
)

NEGATIVE_ID: Final = RejectReason.NEGATIVE_ID.value
UNKNOWN_REGION: Final = RejectReason.UNKNOWN_REGION.value
TOPIC_MISMATCH: Final = RejectReason.TOPIC_MISMATCH.value
STAT_REGRESSED: Final = RejectReason.STAT_REGRESSED.value
REJECT_REASONS: Final = tuple(reason.value for reason in RejectReason)

_NODE_OF: Final = attrgetter("node_id")
_FLUSHED_OF: Final = attrgetter("flushed_entry_id")
_PRUNABLE_OF: Final = attrgetter("prunable_entry_id")


@dataclass(slots=True)
class _Outcome:
    """What one heartbeat's regions come to, before anything is stored."""

    accepted: dict[str, dict[int, StatRow]] = field(default_factory=dict)
    """Rows by topic, as the registry stores them."""
    changed: list[int] = field(default_factory=list)
    """Regions whose prunable id or node changed: their checkpoints are dirty."""
    rejected: list[dict[str, Any]] = field(default_factory=list)
    misrouted: list[RegionStat] = field(default_factory=list)
    ignored_claims: int = 0
    """Idle claims (`topic_latest_entry_id`) sent with a non-empty memtable."""

    def count(self) -> int:
        return sum(map(len, self.accepted.values()))

    def add(self, topic: str, rows: dict[int, StatRow]) -> None:
        batch = self.accepted.get(topic)
        if batch is None:
            self.accepted[topic] = rows
        else:
            batch.update(rows)


def _duplicate(ids: Iterable[int]) -> int | None:
    seen: set[int] = set()
    for region_id in ids:
        if region_id in seen:
            return region_id
        seen.add(region_id)
    return None


class HeartbeatHandler:
    """Validates and applies heartbeats: `handle` (JSON) and `handle_columns` (msgpack
    columns) take a body and return the JSON response body."""

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
        self._ignored_claims = metrics.idle_claims_ignored
        self._unknown_topic_reports = metrics.topic_reports_ignored

    def handle(self, body: bytes) -> bytes:
        """Apply one JSON heartbeat (DESIGN §5); return the JSON response body.

        Raises `InvalidArgument` (HTTP 422) for a body that is not the DESIGN §5 shape
        or names a region twice; nothing is stored in that case.
        """
        doc = decode_json(body)
        now = self._clock()
        outcome = _Outcome()
        self._judge(doc.node_id, doc.regions, now, outcome)
        if outcome.count() + len(outcome.rejected) != len(doc.regions) or outcome.rejected:
            self._refuse_duplicates(r.region_id for r in doc.regions)
        return self._apply(doc.node_id, doc.addr, doc.topics, now, outcome)

    def handle_columns(self, body: bytes) -> bytes:
        """Apply one heartbeat in the columns encoding (`metasrv.wire`): the
        same checks and answers as `handle`, whole columns at a time."""
        doc = decode_columns(body)
        cols = columns_of(doc)
        now = self._clock()
        outcome = _Outcome()
        if not self._judge_columns(doc.node_id, cols, now, outcome):
            self._judge(doc.node_id, cols.regions(), now, outcome)
        if outcome.count() + len(outcome.rejected) != len(cols.region_id) or outcome.rejected:
            self._refuse_duplicates(cols.region_id.tolist())
        return self._apply(doc.node_id, doc.addr, doc.topics, now, outcome)

    @staticmethod
    def _refuse_duplicates(ids: Iterable[int]) -> None:
        duplicate = _duplicate(ids)
        if duplicate is not None:
            raise invalid(
                f"region {duplicate} is reported more than once", ["regions", "region_id"]
            )

    def _judge(self, node_id: int, regions: list[RegionReport], now: float, out: _Outcome) -> None:
        """Region by region: accept, reject, or set aside as misrouted."""
        accepted = out.accepted
        changed = out.changed
        rejected = out.rejected
        keep_misrouted = self._on_misrouted is not None
        route_of = self._topology.routes.get
        buckets = self._registry.buckets.get
        ignored_claims = 0

        # The hot loop: types and bounds were checked by the decoder; locals only, one
        # allocation per valid region (its row tuple).
        for region in regions:
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
                mapped_topic = old.topic  # equals `topic`: the bucket is keyed by it
                if flushed < old.flushed_entry_id:
                    old_manifest = old.manifest_version
                    if manifest is None or old_manifest is None or manifest >= old_manifest:
                        rejected.append({"region_id": region_id, "reason": STAT_REGRESSED})
                        continue
            else:
                route = route_of(region_id)
                if route is None or route.topic != topic:
                    reason = UNKNOWN_REGION if route is None else TOPIC_MISMATCH
                    rejected.append({"region_id": region_id, "reason": reason})
                    if keep_misrouted:
                        out.misrouted.append(
                            RegionStat(
                                region_id, node_id, topic, flushed, latest, memtable, manifest, now
                            )
                        )
                    continue
                mapped_topic = route.topic

            batch = accepted.get(mapped_topic)
            if batch is None:
                batch = accepted[mapped_topic] = {}
            # `prunable_entry_id()`, inline: an idle claim counts only with an empty memtable.
            prunable = flushed
            if latest is not None:
                if memtable:
                    ignored_claims += 1
                elif latest > flushed:
                    prunable = latest
            # The route's topic string, not the parsed copy: a million rows share one.
            batch[region_id] = StatRow(
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
            if old is None or old.prunable_entry_id != prunable or old.node_id != node_id:
                changed.append(region_id)
        out.ignored_claims += ignored_claims

    def _judge_columns(self, node_id: int, cols: Columns, now: float, out: _Outcome) -> bool:
        """The steady state, a column at a time: every region already has a row under
        the topic it names, none went backwards and no id is negative. Returns False,
        having recorded nothing, when that is not so; `_judge` then takes the regions
        one by one."""
        n = len(cols.region_id)
        if n == 0:
            return True
        if cols.region_id.min() < 0 or cols.flushed.min() < -1:
            return False
        claimed = cols.latest
        claims = None if claimed is None else claimed != NULL
        if claimed is not None and claims is not None and claims.any():
            if claimed[claims].min() < -1:
                return False
        else:
            claimed = claims = None

        # Regions in runs of one topic; each run is looked up in its topic's bucket.
        order = np.argsort(cols.topic, kind="stable")
        topic_index = cols.topic[order]
        cuts = (np.flatnonzero(np.diff(topic_index)) + 1).tolist()
        starts, ends = [0, *cuts], [*cuts, n]
        ids = cols.region_id[order]
        id_list = ids.tolist()
        names = cols.topic_names
        buckets = self._registry.buckets
        olds: list[StatRow] = []
        run_topics = []
        for index, start, end in zip(topic_index[starts].tolist(), starts, ends, strict=True):
            bucket = buckets.get(names[index])
            if bucket is None:
                return False
            found = list(map(bucket.get, id_list[start:end]))
            if not all(found):  # a region without a row: unmapped, moved or new here
                return False
            olds.extend(cast(list[StatRow], found))
            run_topics.append(olds[start].topic)  # the map's own string, shared by rows

        flushed = cols.flushed[order]
        if (flushed < np.fromiter(map(_FLUSHED_OF, olds), np.int64, n)).any():
            return False  # stat_regressed, unless the manifest says re-created
        memtable = cols.memtable[order]
        prunable = flushed
        latest: list[int | None] | None = None
        if claimed is not None and claims is not None:
            claims = claims[order]
            claimed = claimed[order]
            idle = claims & (memtable == 0)
            out.ignored_claims += int(np.count_nonzero(claims)) - int(np.count_nonzero(idle))
            prunable = np.where(idle & (claimed > flushed), claimed, flushed)
            latest = _nullable_list(claimed, claims)
        manifest = None if cols.manifest is None else _nullable_list(cols.manifest[order])
        dirty = np.fromiter(map(_PRUNABLE_OF, olds), np.int64, n) != prunable
        dirty |= np.fromiter(map(_NODE_OF, olds), np.int64, n) != node_id

        flushed_list, memtable_list = flushed.tolist(), memtable.tolist()
        prunable_list = prunable.tolist()
        node, at, none = repeat(node_id), repeat(now), repeat(None)
        for topic, start, end in zip(run_topics, starts, ends, strict=True):
            rows = map(
                StatRow,
                node,
                repeat(topic),
                flushed_list[start:end],
                none if latest is None else latest[start:end],
                memtable_list[start:end],
                none if manifest is None else manifest[start:end],
                at,
                prunable_list[start:end],
            )
            out.add(topic, dict(zip(id_list[start:end], rows, strict=False)))
        out.changed.extend(ids[dirty].tolist())
        return True

    def _apply(
        self,
        node_id: int,
        addr: str | None,
        topic_reports: list[TopicReport] | None,
        now: float,
        outcome: _Outcome,
    ) -> bytes:
        """Store a judged heartbeat and answer it."""
        registry = self._registry
        registry.put_topic_rows(outcome.accepted)
        registry.note_node(node_id, addr, now)
        if topic_reports:
            # Only topics the map knows: reports about any other name would be kept
            # until the next leadership change, however many a client invents.
            known = self._topology.has_topic
            ignored = 0
            for report in topic_reports:
                if known(report.topic):
                    registry.report_topic(
                        node_id,
                        report.topic,
                        report.latest_entry_id,
                        report.record_size,
                        report.record_num,
                        now,
                    )
                else:
                    ignored += 1
            if ignored:
                self._unknown_topic_reports.inc(ignored)
        if outcome.changed:
            self._checkpointer.mark(outcome.changed)
        mailbox = self._mailbox
        if mailbox.has_pending(node_id):
            mailbox.observe(node_id, StatSnapshot(outcome.accepted))

        self._heartbeats.inc()
        count = outcome.count()
        if count:
            self._region_stats.inc(count)
        if outcome.ignored_claims:
            self._ignored_claims.inc(outcome.ignored_claims)
        for item in outcome.rejected:
            self._rejected[item["reason"]].inc()
        if outcome.misrouted and self._on_misrouted is not None:
            self._on_misrouted(outcome.misrouted)
        return orjson.dumps(
            {
                "leader": self._leader_addr(),
                "instructions": mailbox.pending_wire(node_id),
                "rejected": outcome.rejected,
            }
        )


def _nullable_list(column: np.ndarray, present: np.ndarray | None = None) -> list[int | None]:
    """A column's values with its `NULL`s as None."""
    if present is None:
        present = column != NULL
    if present.all():
        values: list[int | None] = column.tolist()
        return values
    boxed = column.astype(object)
    boxed[~present] = None
    return boxed.tolist()  # type: ignore[no-any-return]
